"""Fakes for the bulk tests: a recording scorer, a loopback ``/v1/score`` server, and file helpers."""

from __future__ import annotations

import collections
import json
import threading
from pathlib import Path

from spinf.errors import ApiError
from tests.loopback import JsonHandler, LoopbackServer

POS = {"id": "pos", "template": "\nIs it positive? Answer:{?}", "options": [" yes", " no"]}
TONE = {
    "id": "tone",
    "template": "\nTone: {t}?{?}",
    "combinations": "all",
    "values": {"t": ["calm", "angry"]},
    "options": [" yes", " no", " maybe"],
}
OWN = {"id": "own", "template": "\nIs it {x}? Answer:{?}", "combinations": [{"x": "long"}], "options": [" yes", " no"]}
REQUEST = {"scoring": {"queries": [POS, TONE]}}
WORDS = "good bad fine awful great dull nice slow loud quiet".split()


def make_inputs(n: int, *, start: int = 0) -> list[dict]:
    """Inputs in the file's form: ``content`` or ``messages``, some with ``query_ids`` or their own queries."""
    inputs = []
    for k in range(start, start + n):
        text = " ".join(WORDS[(k * 7 + j) % len(WORDS)] for j in range(k % 6 + 1))
        item: dict = {"id": f"in-{k:04d}"}
        if k % 2:
            item["content"] = text
        else:
            item["messages"] = [{"role": "user", "content": text}]
        if k % 5 == 0:
            item["query_ids"] = ["tone"]
        if k % 7 == 0:
            item["queries"] = [OWN]
        inputs.append(item)
    return inputs


def as_api_input(item: dict) -> dict:
    """What the bulk runner must send for a file input: ``content`` turned into one user message."""
    out = {k: v for k, v in item.items() if k != "content"}
    if "content" in item:
        out["messages"] = [{"role": "user", "content": item["content"]}]
    return out


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def fake_response(body: dict) -> dict:
    """A response of the right shape whose numbers depend on each input, computed without a model."""
    results = []
    for item in body["inputs"]:
        size = len(json.dumps(item["messages"]))
        results.append({"input_id": item["id"], "queries": [{"id": "size", "combinations": [{"n": size}]}]})
    return {"object": "score", "results": results, "warnings": []}


class Recorder:
    """A fake scorer that records the input ids of every call it answers; calls after ``fail_after`` raise."""

    def __init__(self, fail_after: int | None = None):
        self.calls: list[list[str]] = []
        self._fail_after = fail_after
        self._lock = threading.Lock()

    def __call__(self, body: dict) -> dict:
        with self._lock:
            if self._fail_after is not None and len(self.calls) >= self._fail_after:
                raise RuntimeError("the scorer died")
            self.calls.append([item["id"] for item in body["inputs"]])
        return fake_response(body)

    @property
    def counts(self) -> collections.Counter:
        return collections.Counter(i for call in self.calls for i in call)


# The engine is the session's tiny engine, shared by every FakeServer, and one caller drives it at a time.
_ENGINE_LOCK = threading.Lock()


class _Handler(JsonHandler):
    def do_POST(self) -> None:
        fake: FakeServer = self.server.fake
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with fake.lock:
            ids = [i["id"] for i in body["inputs"]]
            fake.seen.append((self.path, self.headers.get("Authorization"), ids))
            reply = fake.once_for.pop(ids[0], None) if ids else None
            if reply is None and fake.script:
                reply = fake.script.pop(0)
        if reply is None:
            with _ENGINE_LOCK:
                try:
                    reply = (200, {}, fake.engine.score(body))
                except ApiError as exc:
                    reply = (exc.status, {}, exc.envelope("scr_fake"))
        status, headers, payload = reply
        self.answer(status, payload, headers)


class FakeServer(LoopbackServer):
    """A ``/v1/score`` server on 127.0.0.1: answers ``script`` replies ``(status, headers, body)`` first, then
    scores with ``engine`` (one call at a time, across all fake servers). ``once_for`` maps an input id to a reply
    given once, to the first call whose inputs start with it, whenever that call comes: a test that must not
    depend on which of several concurrent calls arrives first names its call. ``seen`` records ``(path,
    Authorization, input ids)`` per call."""

    def __init__(self, engine, script: list | None = None, *, once_for: dict | None = None):
        super().__init__(_Handler)
        self.engine = engine
        self.script = list(script or [])
        self.once_for = dict(once_for or {})
        self.seen: list[tuple[str, str | None, list[str]]] = []
        self.lock = threading.Lock()


def assert_close(actual, expected, path: str = "", tol: float = 1e-6) -> None:
    """Equal JSON values, numbers to ``tol``; the failure names the path."""
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        assert actual == expected, path
    elif isinstance(expected, int | float):
        assert isinstance(actual, int | float) and abs(actual - expected) <= tol, (path, actual, expected)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), path
        for key in expected:
            assert_close(actual[key], expected[key], f"{path}.{key}", tol)
    else:
        assert isinstance(actual, list) and len(actual) == len(expected), path
        for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close(a, e, f"{path}.{k}", tol)
