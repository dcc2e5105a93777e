"""Calibration of fp8s activation scales (engine spec B.9): a scale table from a corpus of scoring requests.

The engine (`calibration_engine`: the checkpoint in float precision) scores the corpus while every decoder linear's
input is observed; each linear's scale is the power of two at least ``headroom`` times the largest input seen.
Requests the engine refuses are skipped (counted in the table). Where tables live and how the engine loads them is
`spinf.engine.scales`.
"""

from __future__ import annotations

import datetime
import gzip
import json
from pathlib import Path

import attrs
import torch

from spinf.catalog import resolve_model
from spinf.engine.engine import Engine
from spinf.engine.hardware import parse_device
from spinf.engine.quant import DEFAULT_HEADROOM, AmaxRecorder
from spinf.engine.scales import TABLE_FORMAT
from spinf.errors import ApiError, ConfigError


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


def calibration_engine(settings) -> Engine:
    """The engine a calibration observes: the settings' checkpoint in float precision, whatever ``quant`` says.

    The spec calibrates under dynamic fp8, which this build does not run; the float scheme fp8s quantizes from (bf16
    on a GPU, fp32 on the CPU and for the tiny model) sees the same inputs up to rounding. Never fp8s itself, so an
    existing table plays no part in making its successor.
    """
    engine = settings.engine
    on_cpu = parse_device(engine.device)[0] == "cpu"
    quant = "fp32" if on_cpu or resolve_model(engine.model).is_builtin else "bf16"
    return Engine.from_settings(attrs.evolve(settings, engine=attrs.evolve(engine, quant=quant)))


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
