"""Calibration of fp8s activation scales (engine spec B.9): a scale table from a corpus of scoring requests.

The engine scores the corpus in its own precision while every decoder linear's input is observed; each linear's
scale is the power of two at least ``headroom`` times the largest input seen. Requests the engine refuses are
skipped (counted in the table). Tables live in a store keyed by checkpoint and revision, and a table's id (the
short sha of its file) names it in the system fingerprint.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import json
import os
from pathlib import Path

import torch

from spinf.engine.quant import DEFAULT_HEADROOM, AmaxRecorder
from spinf.errors import ApiError, ConfigError

TABLE_FORMAT = 1


def read_corpus(path: str | Path) -> list[dict]:
    """Scoring request bodies from a JSON file (gzip-compressed or plain): a list, or ``{"requests": [...]}``."""
    raw = Path(path).read_bytes()
    try:
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--corpus {path}: not a (gzip-compressed) JSON file: {exc}") from exc
    bodies = data.get("requests") if isinstance(data, dict) else data
    if not isinstance(bodies, list) or not all(isinstance(b, dict) for b in bodies) or not bodies:
        raise ConfigError(f'--corpus {path}: expected a non-empty list of request bodies (or {{"requests": [...]}})')
    return bodies


def calibrate(engine, bodies: list[dict], *, headroom: float = DEFAULT_HEADROOM, corpus_name: str = "") -> dict:
    """The scale table for ``engine``'s checkpoint from ``bodies`` (each scored once, refused ones skipped)."""
    recorder = AmaxRecorder()
    scored = refused = tokens = 0
    with engine.model.observing(recorder.observe):
        for body in bodies:
            try:
                answer = engine.score(body, trusted=True)
            except ApiError:
                refused += 1
                continue
            scored += 1
            tokens += answer["usage"]["processed_tokens"]
    if not scored:
        raise ConfigError("calibration: the engine refused every request of the corpus")
    return {
        "format": TABLE_FORMAT,
        "model": engine.model_id,
        "revision": engine.revision,
        "scheme": "fp8s",
        "headroom": headroom,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": {"quant": engine.quant, "device": str(engine.device), "torch": torch.__version__},
        "corpus": {"file": corpus_name, "requests": scored, "refused": refused, "tokens": tokens},
        "amax": dict(sorted(recorder.amax.items())),
        "scales": recorder.scales(headroom),
    }


def store_path(model_id: str, revision: str, root: str | Path | None = None) -> Path:
    """Where the table of a checkpoint revision lives: ``<HF_HOME>/spinf/scales/<repo>/<revision>.json``."""
    if root is None:
        home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
        root = Path(home).expanduser() / "spinf" / "scales"
    return Path(root) / model_id.replace("/", "--") / f"{revision or 'unpinned'}.json"


def write_table(table: dict, path: str | Path) -> str:
    """Write the table (atomically) and return its id: the first 10 hex digits of the file's sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(table, indent=1) + "\n").encode()
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)
    return hashlib.sha256(data).hexdigest()[:10]
