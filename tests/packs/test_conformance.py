"""Conformance of the pack evaluator with spinf-client 0.3.1's ``packs.evaluate``, the reference (packs.md §11).

For seeded random packs, results and call settings (``tests.packs.random_packs``), our unrounded output must equal
the client's: every number within 1e-6; every boolean, null, id, key, key order and list order exactly; ``warning``
present in both or in neither. Our server entry must equal the client's output rounded with ``round(x, 6)``, with
id, version and context added. Where the client raises, ours must raise ``PackEvaluationError``. Each pack is also
tried at its boundaries (thresholds and quantile values exactly at its scores). The default run checks a fixed
sample of 2,000 packs, which our validator must pass; ``-m slow`` runs 40,000 more. The repository's fixture pack
(``tiny/moderation``) is checked on random results too. Whether the lock matches is decided by our
``spinf.packs.lock`` while the generator locks packs with the client's ``lock_of``, so the two must agree as well.
"""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path

import pytest
import spinf_client.packs as reference

from spinf.packs.evaluate import PackEvaluationError, answers_from_queries, evaluate, pack_entry
from spinf.packs.lock import lock_of
from spinf.packs.validate import check_pack
from tests.packs.random_packs import random_calls, random_pack, random_result
from tests.packs.tone_vectors import MINIMAL, RESULT, TONE, tone_broken_lock, tone_hidden, tone_logprob

FIXTURE = Path(__file__).parents[2] / "fixtures" / "packs" / "moderation" / "0.1.0.json"
DEFAULT_SEEDS = range(2000)
SLOW_SEEDS = range(2000, 42000)


def differences(ours, theirs, path="$") -> list[str]:
    """Where two outputs differ under §11.2's rules, as readable paths (empty when they conform)."""
    if isinstance(theirs, bool) or isinstance(ours, bool) or theirs is None or ours is None:
        return [] if ours is theirs else [f"{path}: {ours!r} != {theirs!r}"]
    if isinstance(theirs, int | float) and isinstance(ours, int | float):
        close = math.isclose(ours, theirs, rel_tol=0, abs_tol=1e-6)
        return [] if close else [f"{path}: {ours!r} != {theirs!r}"]
    if isinstance(theirs, dict) and isinstance(ours, dict):
        if list(ours) != list(theirs):
            return [f"{path}: keys {list(ours)} != {list(theirs)}"]
        found = []
        for key in theirs:
            if key != "warning":
                found += differences(ours[key], theirs[key], f"{path}.{key}")
        return found
    if isinstance(theirs, list) and isinstance(ours, list):
        if len(ours) != len(theirs):
            return [f"{path}: {ours!r} != {theirs!r}"]
        return [
            d
            for index, pair in enumerate(zip(ours, theirs, strict=True))
            for d in differences(*pair, f"{path}[{index}]")
        ]
    return [] if ours == theirs and type(ours) is type(theirs) else [f"{path}: {ours!r} != {theirs!r}"]


def rounded_like_server(output: dict) -> dict:
    """The client's unrounded output as §5.4 rounds it: scores, percentiles and the decision's numbers."""
    categories = {
        name: {**values, "score": round(values["score"], 6), "percentile": _round(values["percentile"])}
        for name, values in output["categories"].items()
    }
    decision = {
        key: _round(value) if key in ("score", "threshold") else value for key, value in output["decision"].items()
    }
    return {"categories": categories, "decision": decision}


def _round(value):
    return None if value is None else round(value, 6)


def check(pack: dict, result: dict, call: dict) -> list[str]:
    """Our evaluation against the reference's on one pack, result and call; the differences found."""
    lock = (pack["decision"].get("micro_layer") or {}).get("lock")
    lock_ok = lock is not None and lock == lock_of(pack)
    try:
        theirs = reference.evaluate(pack, reference.answers_from_result(result, pack), **call)
    except (KeyError, ValueError):  # the reference's failures: ours must fail too
        with pytest.raises(PackEvaluationError):
            evaluate(pack, answers_from_queries(pack, result["queries"]), lock_ok=lock_ok, **call)
        return []
    ours = evaluate(pack, answers_from_queries(pack, result["queries"]), lock_ok=lock_ok, **call)
    found = differences(ours, theirs)
    if ("warning" in ours) != ("warning" in theirs):
        found.append(f"warning: ours {'warning' in ours}, theirs {'warning' in theirs}")
    entry = pack_entry(pack, "plain", ours)
    expected = {"id": pack["pack"], "version": pack["version"], "context": "plain", **rounded_like_server(theirs)}
    found += differences(entry, expected, "entry")
    return found


def at_the_boundaries(pack: dict, result: dict) -> tuple[dict, list[dict]]:
    """The pack with each score placed exactly on a (tied) ``normal_quantiles`` value, and calls whose thresholds
    are exactly the scores and the decision's value: random draws almost never hit ``≥`` at equality."""
    try:
        default = reference.evaluate(pack, reference.answers_from_result(result, pack))
    except (KeyError, ValueError):
        return pack, []
    scores = {name: values["score"] for name, values in default["categories"].items()}
    placed = copy.deepcopy(pack)
    for name, spec in placed["categories"].items():
        score = scores[name]
        spec["normal_quantiles"] = {"levels": [0.1, 0.5, 0.6, 0.9], "values": [score / 2, score, score, score + 0.1]}
    calls = [{"thresholds": scores}, {"mode": "per_category", "thresholds": scores, "critical": list(scores)}]
    if "max" in placed["decision"]:
        calls.append({"mode": "max", "threshold": max(scores.values())})
    if "score" in default["decision"]:
        calls.append({"threshold": default["decision"]["score"]})
    return placed, calls


def check_seed(seed: int) -> list[str]:
    rng = random.Random(seed)
    pack = random_pack(rng)
    result = random_result(rng, pack)
    found = [f"seed {seed}, call {call}: {d}" for call in random_calls(rng, pack) for d in check(pack, result, call)]
    placed, calls = at_the_boundaries(pack, result)
    return found + [f"seed {seed}, boundary call {call}: {d}" for call in calls for d in check(placed, result, call)]


VECTOR_CALLS = [
    {},
    {"mode": "max"},
    {"mode": "max", "threshold": 0.2, "critical": []},
    {"mode": "per_category", "thresholds": {"rudeness": 0.2, "targeted": 0.005}},
    {"thresholds": {"rudeness": 0.2}},
    {"thresholds": {"rudeness": None, "targeted": 0.001}, "critical": ["targeted"]},
    {"threshold": 0.9},
]


@pytest.mark.parametrize("pack", [TONE, tone_logprob(), tone_broken_lock(), tone_hidden()], ids=lambda p: p["version"])
@pytest.mark.parametrize("call", VECTOR_CALLS)
def test_the_vectors_conform(pack, call):
    assert check(pack, RESULT, call) == []


def test_the_minimal_pack_conforms():
    result = {
        "queries": [
            {
                "id": "on_topic",
                "combinations": [{"values": {}, "options": RESULT["queries"][0]["combinations"][0]["options"]}],
            }
        ]
    }
    assert check(MINIMAL, result, {}) == []


@pytest.mark.parametrize("edited", [False, True], ids=["lock-ok", "lock-broken"])
def test_the_fixture_moderation_pack_conforms(edited):
    pack = json.loads(FIXTURE.read_text())
    if edited:
        pack["reads"][0]["mean"] += 0.5
    rng = random.Random(13)
    found = []
    for _ in range(200):
        result = random_result(rng, pack)
        found += [f"{call}: {d}" for call in random_calls(rng, pack) for d in check(pack, result, call)]
    assert found == []


def test_the_random_packs_are_valid():
    assert [seed for seed in DEFAULT_SEEDS if len(check_pack(random_pack(random.Random(seed))))] == []


@pytest.mark.parametrize("chunk", range(8))
def test_random_packs_conform(chunk):
    seeds = DEFAULT_SEEDS[chunk::8]
    assert [d for seed in seeds for d in check_seed(seed)] == []


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(40))
def test_random_packs_conform_at_length(chunk):
    seeds = SLOW_SEEDS[chunk::40]
    assert [d for seed in seeds for d in check_seed(seed)] == []
