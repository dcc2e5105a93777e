"""Validation of a pack file's categories and decision (packs spec §1.8, §1.9, §8), for `spinf.packs.validate`.

Problems are appended to the caller's `Problems` with their JSON paths; nothing here raises. The micro-layer's
weights are decoded only to count their floats (§1.9's layout); the lock is checked for its form only.
"""

from __future__ import annotations

import base64
import binascii
import re

from spinf.packs.problems import Problems, is_int, is_number

MODES = ("max", "per_category", "micro_layer")
FALLBACKS = ("max", "per_category")
LOCK_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def check_categories(categories: object, reads: object, problems: Problems, draft: bool) -> None:
    if not (isinstance(categories, dict) and categories):
        problems.add("categories", "categories must be an object of id -> spec, with at least one category")
        return
    reads = reads if isinstance(reads, list) else []
    fed = {r.get("category") for r in reads if isinstance(r, dict) and isinstance(r.get("category"), str)}
    for name, spec in categories.items():
        path = f"categories.{name}"
        if not isinstance(spec, dict):
            problems.add(path, f"the category {name!r} must be an object")
            continue
        platt = spec.get("platt")
        if not (draft and "platt" not in spec) and not (
            isinstance(platt, list) and len(platt) == 2 and all(map(is_number, platt))
        ):
            problems.add(f"{path}.platt", "platt must be [a, b], two numbers")
        threshold = spec.get("threshold")
        if threshold is not None and not (is_number(threshold) and 0 <= threshold <= 1):
            problems.add(f"{path}.threshold", "threshold must be null, or a number between 0 and 1")
        if name not in fed:
            problems.add(path, f"no read feeds the category {name!r}")
        if spec.get("normal_quantiles") is not None and not _quantiles_ok(spec["normal_quantiles"]):
            problems.add(
                f"{path}.normal_quantiles",
                "normal_quantiles must be {levels, values}: two non-decreasing lists of numbers of the same "
                "length, at least 2 long",
            )
        if spec.get("aggregate") not in (None, "views"):
            problems.add(f"{path}.aggregate", "aggregate must be 'views' or absent")
        requires = spec.get("requires", [])
        if not (isinstance(requires, list) and all(r in categories and r != name for r in _hashable(requires))):
            problems.add(f"{path}.requires", "requires must be a list of other existing categories")
        if not isinstance(spec.get("decides", True), bool):
            problems.add(f"{path}.decides", "decides must be true or false")


def _hashable(items: list) -> list:
    """The items, or a list with one impossible id when some are not strings (so a membership check fails)."""
    return items if all(isinstance(item, str) for item in items) else [None]


def _quantiles_ok(quantiles: object) -> bool:
    if not isinstance(quantiles, dict):
        return False
    levels, values = quantiles.get("levels"), quantiles.get("values")
    lists = [levels, values]
    if not all(isinstance(x, list) and len(x) >= 2 and all(map(is_number, x)) for x in lists):
        return False
    return len(levels) == len(values) and all(all(a <= b for a, b in zip(x, x[1:], strict=False)) for x in lists)


def check_decision(raw: dict, problems: Problems, draft: bool) -> None:
    decision = raw["decision"]
    if not (isinstance(decision, dict) and decision.get("mode") in MODES):
        problems.add(
            "decision", "decision must be an object whose mode is one of 'max', 'per_category', 'micro_layer'"
        )
        return
    mode, fallback = decision["mode"], decision.get("fallback", "per_category")
    if fallback not in FALLBACKS:
        problems.add("decision.fallback", "fallback must be 'max' or 'per_category'")
    if "max" in decision or "max" in (mode, fallback):
        limit = decision.get("max")
        fitted = isinstance(limit, dict) and is_number(limit.get("threshold"))
        unfitted = limit is None or isinstance(limit, dict) and "threshold" not in limit
        if not (fitted or draft and unfitted):
            problems.add("decision.max", "decision.max must be {threshold} with a number")
    categories = raw["categories"] if isinstance(raw["categories"], dict) else {}
    critical = decision.get("critical", [])
    if not (isinstance(critical, list) and all(isinstance(c, str) and c in categories for c in critical)):
        problems.add("decision.critical", "decision.critical must be a list of existing category ids")
    micro = decision.get("micro_layer")
    if micro:
        _check_micro_layer(micro, raw, problems)
    elif mode == "micro_layer" and not draft:
        problems.add("decision.micro_layer", "decision.micro_layer is needed by mode 'micro_layer'")


def _check_micro_layer(micro: object, raw: dict, problems: Problems) -> None:
    path = "decision.micro_layer"
    if not isinstance(micro, dict):
        problems.add(path, "decision.micro_layer must be an object")
        return
    inputs = micro.get("inputs")
    if not (isinstance(inputs, list) and inputs and all(isinstance(x, str) for x in inputs)):
        problems.add(f"{path}.inputs", "inputs must be a non-empty list of 'c:<category>' and 'r:<read id>'")
        inputs = None
    else:
        categories = raw["categories"] if isinstance(raw["categories"], dict) else {}
        reads = raw["reads"] if isinstance(raw["reads"], list) else []
        read_ids = {r.get("id") for r in reads if isinstance(r, dict) and isinstance(r.get("id"), str)}
        for j, name in enumerate(inputs):
            kind, _, target = name.partition(":")
            if not (kind == "c" and target in categories or kind == "r" and target in read_ids):
                problems.add(
                    f"{path}.inputs.{j}", f"the input {name!r} is not c:<category> or r:<read id> of this pack"
                )
    hidden = micro.get("hidden", 0)
    if not (is_int(hidden) and hidden >= 0):
        problems.add(f"{path}.hidden", "hidden must be a whole number of hidden units, 0 or more")
        hidden = None
    _check_weights(micro.get("weights"), inputs, hidden, problems)
    if micro.get("dtype", "float32") != "float32":
        problems.add(f"{path}.dtype", f"only dtype 'float32' is accepted, not {micro.get('dtype')!r}")
    if not (isinstance(micro.get("lock"), str) and LOCK_RE.match(micro["lock"])):
        problems.add(f"{path}.lock", "the lock must be 'sha256:' and 64 lowercase hex digits")


def _check_weights(weights: object, inputs: list | None, hidden: int | None, problems: Problems) -> None:
    path = "decision.micro_layer.weights"
    try:
        data = base64.b64decode(weights, validate=True) if isinstance(weights, str) else None
    except (binascii.Error, ValueError):
        data = None
    if data is None or len(data) % 4:
        problems.add(path, "weights must be standard base64 of float32 values (a byte length that is a multiple of 4)")
        return
    if inputs is None or hidden is None:
        return
    n, found = len(inputs), len(data) // 4
    expected = n + 2 if hidden == 0 else n * hidden + 2 * hidden + 2
    if found != expected:
        rule = "n + 2" if hidden == 0 else "n*h + 2h + 2"
        problems.add(
            path, f"weights hold {found} floats; {n} inputs and {hidden} hidden units need {rule} = {expected}"
        )
