"""The pack evaluator (packs spec §6): one input's answers to a pack's queries become category scores and a decision.

``evaluate`` runs the pipeline of ``spinf.packs.pipeline`` (answers to reads, macros, scores, percentiles, flags)
and then decides (§6.6): the lock gate and fallback, the modes ``micro_layer``, ``max`` and ``per_category``, the
critical rule and the warning. It returns the unrounded output spinf-client's ``packs.evaluate`` returns;
``pack_entry`` makes that the server's ``results[i].packs[]`` entry (§5.3, §5.4: rounded after deciding, with id,
version and context). Nothing here reads a file or checks a lock: the caller says whether the lock matched, as the
server checks it once when it loads the pack (§1.10).
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping, Sequence

from spinf.packs.pipeline import (
    Answers,
    PackEvaluationError,
    answers_from_queries,
    category_flags,
    category_macros,
    effective_thresholds,
    percentile,
    read_z,
    sigmoid,
)

__all__ = ["Answers", "PackEvaluationError", "answers_from_queries", "evaluate", "modes_of", "pack_entry"]

MODES = ("max", "per_category", "micro_layer")

LOCK_WARNING = (
    "the micro-layer lock does not match: the pack was edited after its micro-layer was fitted, "
    "so the fallback mode {mode} decided"
)


def modes_of(pack: Mapping) -> list[str]:
    """The modes a call may choose for this pack, in the spec's order (§1.9)."""
    decision = pack["decision"]
    return [
        mode
        for mode, offered in (
            ("max", decision.get("max")),
            ("per_category", True),
            ("micro_layer", decision.get("micro_layer")),
        )
        if offered
    ]


def micro_layer_weights(micro: Mapping) -> list[float]:
    """The micro-layer's float32 weights as doubles (§1.9: little-endian, standard base64)."""
    try:
        raw = base64.b64decode(micro["weights"], validate=True)
    except (binascii.Error, ValueError) as error:
        raise PackEvaluationError(f"the micro-layer weights are not base64: {error}") from error
    if len(raw) % 4:
        raise PackEvaluationError(f"the micro-layer weights are {len(raw)} bytes, not a multiple of 4")
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def micro_layer_value(micro: Mapping, x: Sequence[float]) -> tuple[float, float]:
    """The layer's value on the inputs x and its stored threshold (§6.6): linear, or one tanh hidden layer."""
    weights = micro_layer_weights(micro)
    n, h = len(x), micro.get("hidden", 0)
    expected = n + 2 if h == 0 else n * h + 2 * h + 2
    if len(weights) != expected:
        raise PackEvaluationError(
            f"the micro-layer has {len(weights)} weights; {n} inputs and {h} hidden need {expected}"
        )
    if h == 0:
        return _dot(x, weights[:n]) + weights[n], weights[-1]
    hidden = []
    for k in range(h):
        column = [weights[i * h + k] for i in range(n)]
        hidden.append(math.tanh(_dot(x, column) + weights[n * h + k]))
    w2 = weights[n * h + h : n * h + 2 * h]
    return _dot(hidden, w2) + weights[n * h + 2 * h], weights[-1]


def _dot(xs: Sequence[float], ws: Sequence[float]) -> float:
    total = 0.0
    for x, w in zip(xs, ws, strict=True):
        total += x * w
    return total


def _used_mode(pack: Mapping, asked: str, lock_ok: bool) -> str:
    """The lock gate (§6.6.1): ``micro_layer`` without a (non-empty) micro-layer or with a broken lock falls back."""
    decision = pack["decision"]
    if asked not in MODES:
        raise PackEvaluationError(f"mode {asked!r} is not one of {', '.join(MODES)}")
    if asked == "micro_layer" and not (decision.get("micro_layer") and lock_ok):
        return decision.get("fallback", "per_category")
    return asked


def _max_threshold(pack: Mapping) -> float:
    offered = pack["decision"].get("max")
    if not offered or "threshold" not in offered:
        raise PackEvaluationError("mode max needs decision.max.threshold, which the pack does not have")
    return offered["threshold"]


def _decide_micro_layer(pack: Mapping, inputs: Mapping[str, Mapping[str, float]], threshold) -> dict:
    micro = pack["decision"]["micro_layer"]
    x = []
    for name in micro["inputs"]:
        source, _, key = name.partition(":")
        if source not in inputs or key not in inputs[source]:
            raise PackEvaluationError(f"micro-layer input {name!r} names no category or read of the pack")
        x.append(inputs[source][key])
    value, stored = micro_layer_value(micro, x)
    t = stored if threshold is None else threshold
    return {"unsafe": value >= t, "mode": "micro_layer", "score": value, "threshold": t}


def _decide_max(pack: Mapping, scores: Mapping[str, float], deciding: Sequence[str], threshold) -> dict:
    t = _max_threshold(pack) if threshold is None else threshold
    top = None
    for category_id in deciding:
        if top is None or scores[category_id] > scores[top]:
            top = category_id
    if top is None:
        return {"unsafe": False, "mode": "max", "score": 0.0, "threshold": t, "category": None}
    return {"unsafe": scores[top] >= t, "mode": "max", "score": scores[top], "threshold": t, "category": top}


def _apply_critical(decision: dict, pack: Mapping, flags: Mapping[str, bool | None], critical) -> None:
    """The critical rule (§6.6.5): flagged critical categories, in list order, force ``unsafe``; ``decides`` is not
    consulted and an id that is not a category is ignored."""
    listed = (pack["decision"].get("critical") or []) if critical is None else critical
    hit = [category_id for category_id in listed if flags.get(category_id) is True]
    if hit:
        decision["critical"] = hit
        if not decision["unsafe"]:
            decision["unsafe"] = True
            decision["by"] = "critical"


def decide(
    pack: Mapping,
    inputs: Mapping[str, Mapping[str, float]],
    scores: Mapping[str, float],
    flags: Mapping[str, bool | None],
    deciding: Sequence[str],
    *,
    lock_ok: bool,
    mode: str | None,
    threshold: float | None,
    critical: Sequence[str] | None,
) -> dict:
    """The decision of §6.6 from the pipeline's values, keys in the order of §5.3. ``inputs`` holds the micro-layer's
    sources: ``{"c": macros by category, "r": z by read}``; ``deciding`` is the deciding set D in pack order."""
    asked = pack["decision"]["mode"] if mode is None else mode
    used = _used_mode(pack, asked, lock_ok)
    # A per-call threshold is returned as a float (§5.4); it applies only to the mode the call asked for.
    call_threshold = None if threshold is None or used != asked else float(threshold)
    if used == "micro_layer":
        decision = _decide_micro_layer(pack, inputs, call_threshold)
    elif used == "max":
        decision = _decide_max(pack, scores, deciding, call_threshold)
    else:
        hit = [category_id for category_id in deciding if flags[category_id] is True]
        decision = {"unsafe": bool(hit), "mode": "per_category", "categories": hit}
    _apply_critical(decision, pack, flags, critical)
    if used != asked:
        decision["warning"] = LOCK_WARNING.format(mode=used)
    return decision


def evaluate(
    pack: Mapping,
    answers: Answers,
    *,
    lock_ok: bool,
    mode: str | None = None,
    threshold: float | None = None,
    thresholds: Mapping[str, float | None] | None = None,
    critical: Sequence[str] | None = None,
) -> dict:
    """The unrounded evaluation of one input (§6): ``{"categories": {id: {score, percentile, flagged}}, "decision"}``.

    ``lock_ok`` says whether the pack's micro-layer lock matches (§1.10). The call's ``mode``, ``threshold``,
    ``thresholds`` and ``critical`` are None when the call does not give them; ``critical=[]`` means none.
    """
    z = read_z(pack, answers)
    macros = category_macros(pack, z)
    scores = {}
    for category_id, spec in pack["categories"].items():
        a, b = spec["platt"]
        scores[category_id] = sigmoid(a * macros[category_id] + b)
    effective = effective_thresholds(pack, thresholds)
    flags = category_flags(pack, scores, effective)
    categories = {
        category_id: {
            "score": scores[category_id],
            "percentile": percentile(spec.get("normal_quantiles"), scores[category_id]),
            "flagged": flags[category_id],
        }
        for category_id, spec in pack["categories"].items()
    }
    deciding = [
        category_id
        for category_id, spec in pack["categories"].items()
        if effective[category_id] is not None and spec.get("decides", True) is not False
    ]
    inputs = {"c": macros, "r": z}
    decision = decide(
        pack, inputs, scores, flags, deciding, lock_ok=lock_ok, mode=mode, threshold=threshold, critical=critical
    )
    return {"categories": categories, "decision": decision}


def _rounded(value):
    return None if value is None else round(value, 6)


def pack_entry(pack: Mapping, context: str, evaluation: Mapping) -> dict:
    """The server's ``results[i].packs[]`` entry (§5.3, api §5.9): id, version and context added, and every
    category score and percentile and every number of the decision rounded like ``round(x, 6)`` (§5.4). Flags and
    the decision were made before rounding; a threshold stored as a JSON integer stays that integer."""
    categories = {
        category_id: {
            "score": round(values["score"], 6),
            "percentile": _rounded(values["percentile"]),
            "flagged": values["flagged"],
        }
        for category_id, values in evaluation["categories"].items()
    }
    decision = dict(evaluation["decision"])
    for key in ("score", "threshold"):
        if key in decision:
            decision[key] = _rounded(decision[key])
    return {
        "id": pack["pack"],
        "version": pack["version"],
        "context": context,
        "categories": categories,
        "decision": decision,
    }
