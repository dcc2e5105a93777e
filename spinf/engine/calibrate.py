"""Calibration of fp8s activation scales (engine spec B.9, api spec §10): a scale table from a corpus.

The engine (`calibration_engine`: the checkpoint under dynamic fp8, uncompiled, as the spec asks) scores every request
of the corpus, then the image and audio requests made from folders (`media_requests`), then the parity fixture, while
every decoder linear's input is observed; each linear's scale is the power of two at least ``headroom`` times the
largest input seen, ``2^ceil(log2(headroom · amax / 448))``. A request the engine refuses is scored again input by
input, and only the inputs it refuses are skipped (counted in the table).

A corpus file is gzip-compressed JSON (plain JSON is read too). Its ``requests`` are the reference engine's
``{"kind", "body"}`` entries, each a ``/v1/score`` body counted under its kind, or bare bodies (counted as
``requests``); a bare list of bodies is read as well. Its ``testbed`` is recorded; other keys are logged and ignored.
A body's ``model`` is dropped (the corpus may name another server's model). Where tables live and how the engine
loads them is `spinf.engine.scales`.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import hashlib
import json
import logging
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from spinf.engine.engine import Engine
from spinf.engine.parity import run_parity
from spinf.engine.quant import DEFAULT_HEADROOM, activation_scale
from spinf.engine.scales import TABLE_FORMAT
from spinf.errors import ApiError, ConfigError

log = logging.getLogger(__name__)

# The three yes/no questions every image and audio input is asked (engine spec B.9: always the same three).
MEDIA_QUERY = {
    "id": "q",
    "template": "\n\nQuestion: {F}?\nAnswer:{?}",
    "options": [" Yes", " No"],
    "combinations": [{"F": "Is this safe for children"}, {"F": "Is there a person in it"}, {"F": "Is it outdoors"}],
}
IMAGE_SUFFIXES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
IMAGES_PER_REQUEST, CLIPS_PER_REQUEST = 8, 4
SAMPLE_SEED = 7  # which files of a folder are read: the same on every run
# A corpus body's limits, beyond the settings' (the reference's): long documents set most maxima.
MAX_PROCESSED_TOKENS = 50_000_000
_ENTRY_KEYS, _FILE_KEYS = frozenset({"kind", "body"}), frozenset({"requests", "testbed"})


@attrs.frozen
class CorpusRequest:
    """One scoring request of the calibration and the kind its inputs are counted under."""

    kind: str
    body: Mapping


@attrs.frozen
class Corpus:
    """A corpus file's requests and what the table records of it (``sha256_12``: its bytes' short hash)."""

    requests: tuple[CorpusRequest, ...]
    file: str = ""
    testbed: str | None = None
    sha256_12: str | None = None

    @classmethod
    def of_bodies(cls, bodies: Sequence[Mapping], file: str = "") -> Corpus:
        return cls(tuple(CorpusRequest("requests", body) for body in bodies), file)


def read_corpus(path: str | Path) -> Corpus:
    """The corpus in a JSON file, gzip-compressed or plain (see the module docstring for its shapes)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--corpus {path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, ValueError) as exc:
        raise ConfigError(f"--corpus {path}: not a (gzip-compressed) JSON file: {exc}") from exc
    entries = data.get("requests") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries or not all(isinstance(entry, dict) for entry in entries):
        raise ConfigError(
            f'--corpus {path}: expected {{"requests": [{{"kind", "body"}}, ...]}} or a non-empty list of bodies'
        )
    requests = []
    for index, entry in enumerate(entries):
        if "body" not in entry:
            requests.append(CorpusRequest("requests", entry))
            continue
        kind, body = entry.get("kind") or "requests", entry["body"]
        if not isinstance(kind, str) or not isinstance(body, dict):
            raise ConfigError(f"--corpus {path}: requests.{index}: a kind must be text and a body an object")
        _ignore(f"--corpus {path}: requests.{index}", set(entry) - _ENTRY_KEYS)
        requests.append(CorpusRequest(kind, body))
    testbed = data.get("testbed") if isinstance(data, dict) else None
    if isinstance(data, dict):
        _ignore(f"--corpus {path}", set(data) - _FILE_KEYS)
    short = hashlib.sha256(raw).hexdigest()[:12]
    return Corpus(tuple(requests), Path(path).name, testbed if isinstance(testbed, str) else None, short)


def _ignore(where: str, keys: set[str]) -> None:
    if keys:
        log.warning("%s: ignoring what calibration does not read: %s", where, ", ".join(sorted(keys)))


def media_requests(
    engine: Engine, images: str | Path | None, audio: str | Path | None, *, n_images: int = 24, n_audio: int = 8
) -> list[CorpusRequest]:
    """Requests asking `MEDIA_QUERY` of ``n_images`` images of the folder ``images`` (JPEG and PNG, searched
    recursively) read at high and then at low detail, and of ``n_audio`` WAV clips of ``audio``; a sample drawn the
    same way on every run. A kind the engine does not read is left out (and logged)."""
    rng = random.Random(SAMPLE_SEED)
    requests = []
    if images is not None and _reads(engine, "image", images):
        files = [f for f in sorted(Path(images).rglob("*.*")) if f.suffix.lower() in IMAGE_SUFFIXES]
        files = rng.sample(files, min(n_images, len(files)))
        for detail in ("high", "low"):
            inputs = [_image_input(k, path, detail) for k, path in enumerate(files)]
            requests += _batched(f"image/{detail}", inputs, IMAGES_PER_REQUEST)
    if audio is not None and _reads(engine, "audio", audio):
        files = sorted(f for f in Path(audio).rglob("*.*") if f.suffix.lower() == ".wav")
        files = rng.sample(files, min(n_audio, len(files)))
        inputs = [_audio_input(k, path) for k, path in enumerate(files)]
        requests += _batched("audio", inputs, CLIPS_PER_REQUEST)
    return requests


def check_folders(images: str | Path | None, audio: str | Path | None) -> None:
    """`ConfigError` for an ``--images`` or ``--audio`` that is not a folder (before the slow load)."""
    for flag, folder in (("--images", images), ("--audio", audio)):
        if folder is not None and not Path(folder).is_dir():
            raise ConfigError(f"{flag} {folder}: not a folder")


def _reads(engine: Engine, kind: str, folder: str | Path) -> bool:
    if kind in engine.features.media:
        return True
    log.warning("calibration: %s reads no %s; %s is left out", engine.served_name, kind, folder)
    return False


def _image_input(k: int, path: Path, detail: str) -> dict:
    url = f"data:{IMAGE_SUFFIXES[path.suffix.lower()]};base64,{_b64(path)}"
    parts = [{"type": "image_url", "image_url": {"url": url, "detail": detail}}]
    if k % 2:  # every other image with a line of text before it
        parts.insert(0, {"type": "text", "text": "Describe what you see.\n"})
    return {"id": f"i{k}", "messages": [{"role": "user", "content": parts}]}


def _audio_input(k: int, path: Path) -> dict:
    parts = [
        {"type": "text", "text": "Listen to this clip.\n"},
        {"type": "input_audio", "input_audio": {"data": _b64(path), "format": "wav"}},
    ]
    return {"id": f"a{k}", "messages": [{"role": "user", "content": parts}]}


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _batched(kind: str, inputs: list[dict], size: int) -> list[CorpusRequest]:
    return [
        CorpusRequest(kind, {"inputs": inputs[i : i + size], "scoring": {"queries": [MEDIA_QUERY]}})
        for i in range(0, len(inputs), size)
    ]


def calibration_engine(settings) -> Engine:
    """The engine a calibration observes: the settings' checkpoint under dynamic fp8 without compile (engine spec
    B.9), whatever ``quant`` and ``compile`` say, so an existing table plays no part in making its successor. On the
    CPU fp8 runs emulated (the tiny model, local folders). Its limits let a trusted body reach the engine's longest
    input and `MAX_PROCESSED_TOKENS` per request, as the reference's calibration allows."""
    engine = settings.engine
    engine = Engine.from_settings(attrs.evolve(settings, engine=attrs.evolve(engine, quant="fp8", compile=False)))
    if engine.family != "gemma4":  # only the Gemma stack observes its linears
        raise ConfigError(f"calibration: fp8s scale tables are for the Gemma stack, and {engine.served_name} is not")
    engine.limits = attrs.evolve(
        engine.limits, max_content_tokens=engine.shape.max_tokens, max_processed_tokens=MAX_PROCESSED_TOKENS
    )
    return engine


@attrs.define
class _Maxima:
    """The largest ``|input|`` of each linear and the corpus kind that set it (``kind``: the one being scored)."""

    amax: dict[str, float] = attrs.field(factory=dict)
    kind_of: dict[str, str] = attrs.field(factory=dict)
    kind: str = ""

    def observe(self, name: str, x) -> None:
        seen = float(x.detach().abs().max())
        if seen > self.amax.get(name, -1.0):
            self.amax[name], self.kind_of[name] = seen, self.kind


@attrs.define
class _Counts:
    inputs: dict[str, int] = attrs.field(factory=dict)
    requests: int = 0
    refused: int = 0
    tokens: int = 0


def calibrate(
    engine: Engine,
    corpus: Corpus | Sequence[Mapping],
    *,
    headroom: float = DEFAULT_HEADROOM,
    corpus_name: str = "",
    media: Sequence[CorpusRequest] = (),
    fixture: Mapping | None = None,
) -> dict:
    """The scale table for ``engine``'s checkpoint from ``corpus`` (a `Corpus`, or request bodies), the ``media``
    requests and the parity ``fixture`` (each scored once; refused inputs skipped)."""
    if not isinstance(corpus, Corpus):
        corpus = Corpus.of_bodies(corpus, corpus_name)
    maxima, counts = _Maxima(), _Counts()
    with engine.model.observing(maxima.observe):
        for request in (*corpus.requests, *media):
            maxima.kind = request.kind
            _score(engine, request, counts)
        if fixture is not None:
            maxima.kind = "fixture"
            report = run_parity(engine.loop, fixture, passes=1)
            counts.inputs["fixture"] = len(fixture["jobs"])
            counts.tokens += report["passes"][0]["tokens"]
    if not counts.requests and fixture is None:
        raise ConfigError("calibration: the engine refused every request of the corpus")
    info = engine.info()
    return {
        "format": TABLE_FORMAT,
        "model": engine.model_id,
        "revision": engine.revision,
        "scheme": "fp8s",
        "headroom": headroom,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": {key: info[key] for key in ("quant", "gpu", "torch", "image")} | {"device": str(engine.device)},
        "corpus": {
            "file": corpus.file or corpus_name,
            "testbed": corpus.testbed,
            "sha256_12": corpus.sha256_12,
            "inputs": counts.inputs,
            "requests": counts.requests,
            "refused": counts.refused,
            "tokens": counts.tokens,
            "images": counts.inputs.get("image/high", 0) > 0,
            "audio": counts.inputs.get("audio", 0) > 0,
        },
        "amax": dict(sorted(maxima.amax.items())),
        "amax_from": dict(sorted(maxima.kind_of.items())),
        "scales": {name: activation_scale(value, headroom) for name, value in sorted(maxima.amax.items())},
    }


def _score(engine: Engine, request: CorpusRequest, counts: _Counts) -> None:
    """Score one request, or, when the engine refuses it, each of its inputs alone, skipping those it refuses."""
    body = {key: value for key, value in request.body.items() if key != "model"}
    inputs = body.get("inputs")
    try:
        answers = [engine.score(body, trusted=True)]
        kept = len(inputs) if isinstance(inputs, list) else 1
    except ApiError as refusal:
        if not isinstance(inputs, list) or len(inputs) < 2:
            _skipped(request.kind, refusal, counts)
            return
        answers = []
        for one in inputs:
            try:
                answers.append(engine.score({**body, "inputs": [one]}, trusted=True))
            except ApiError as alone:
                _skipped(request.kind, alone, counts)
        kept = len(answers)
    if answers:
        counts.requests += 1
        counts.inputs[request.kind] = counts.inputs.get(request.kind, 0) + kept
        counts.tokens += sum(answer["usage"]["processed_tokens"] for answer in answers)


def _skipped(kind: str, refusal: ApiError, counts: _Counts) -> None:
    counts.refused += 1
    log.warning("calibration: skipped a %s input: %s: %s", kind, refusal.code, refusal.message[:120])
