"""One targeted test per branch of the pack evaluator (packs.md §6): answers, reads, views, percentiles, thresholds
and ``requires``, and each decision mode with its lock gate, fallback, thresholds and critical rule.

The packs here give each category one pair read with ``platt: [1, 0]``, mean 0 and sd 1, so a category's score is
its query's first probability (to rounding); a test sets scores by choosing the answers.
"""

from __future__ import annotations

import base64
import math
import struct

import pytest

from spinf.packs.evaluate import PackEvaluationError, answers_from_queries, evaluate, modes_of, pack_entry
from spinf.packs.pipeline import category_macros, percentile, read_value


def float32s(*values: float) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def make_pack(categories: dict, decision: dict | None = None) -> dict:
    """A pack with one two-option query and one pair read per category (``q_<id>``, ``r_<id>``)."""
    return {
        "pack": "test/modes",
        "version": "1",
        "model": "m",
        "contexts": {"plain": "{X}"},
        "scoring": {"queries": [{"id": f"q_{c}", "template": "Q{?}", "options": [" y", " n"]} for c in categories]},
        "reads": [
            {"id": f"r_{c}", "query": f"q_{c}", "kind": "pair", "category": c, "mean": 0.0, "sd": 1.0}
            for c in categories
        ],
        "categories": {c: {"platt": [1.0, 0.0], **spec} for c, spec in categories.items()},
        "decision": decision or {"mode": "per_category"},
    }


def answers(**scores: float) -> dict:
    return {(f"q_{c}", None): [p, 1 - p] for c, p in scores.items()}


def decide(pack, scores, *, lock_ok=True, **call):
    return evaluate(pack, answers(**scores), lock_ok=lock_ok, **call)["decision"]


def flags(pack, scores, **call):
    return {c: v["flagged"] for c, v in evaluate(pack, answers(**scores), lock_ok=True, **call)["categories"].items()}


# answers (§6.1) ------------------------------------------------------------------------------------------------------

TWO = [{"text": " y", "logprob": math.log(0.25), "p": 0.25}, {"text": " n", "logprob": math.log(0.75), "p": 0.75}]
OTHER = [{"text": " y", "logprob": math.log(0.5), "p": 0.5}, {"text": " n", "logprob": math.log(0.5), "p": 0.5}]


def test_answers_keep_only_the_packs_queries_keyed_by_f_and_the_later_combination_wins():
    pack = make_pack({"a": {}})
    queries = [
        {"id": "own", "combinations": [{"values": {}, "options": TWO}]},
        {"id": "q_a", "combinations": [{"values": {"G": "x"}, "options": TWO}, {"values": {}, "options": OTHER}]},
        {"id": "q_a", "combinations": [{"values": {"F": "f"}, "options": TWO}]},
    ]
    assert answers_from_queries(pack, queries) == {("q_a", None): [0.5, 0.5], ("q_a", "f"): [0.25, 0.75]}


def test_logprob_answers_are_renormalised_over_the_listed_options():
    pack = {**make_pack({"a": {}}), "answers": "logprob"}
    options = [{"text": " y", "logprob": -3.0, "p": 0.0}, {"text": " n", "logprob": -3.0, "p": 0.0}]
    queries = [{"id": "q_a", "combinations": [{"values": {}, "options": options}]}]
    assert answers_from_queries(pack, queries) == {("q_a", None): [pytest.approx(0.5), pytest.approx(0.5)]}


def test_an_answer_missing_for_a_read_fails():
    with pytest.raises(PackEvaluationError, match="r_b"):
        evaluate(make_pack({"a": {}, "b": {}}), answers(a=0.5), lock_ok=True)


# reads (§6.2) --------------------------------------------------------------------------------------------------------

P3 = {("q", None): [0.5, 0.3, 0.0]}  # the 0 is clipped to 1e-9
LOGS = [math.log(p / (0.8 + 1e-9)) for p in (0.5, 0.3, 1e-9)]


def test_option_read():
    assert read_value({"query": "q", "kind": "option", "option": 1, "mu": -0.5}, P3) == pytest.approx(LOGS[1] + 0.5)


def test_any_read_compares_the_other_options_with_option_0():
    a = [lam - mu for lam, mu in zip(LOGS, [0.1, 0.2, 0.3], strict=True)]
    expected = math.log(math.exp(a[1]) + math.exp(a[2])) - a[0]
    assert read_value({"query": "q", "kind": "any", "mu": [0.1, 0.2, 0.3]}, P3) == pytest.approx(expected)


def test_set_read_uses_the_distinct_unsafe_indices():
    a = [lam - mu for lam, mu in zip(LOGS, [0.1, 0.2, 0.3], strict=True)]
    expected = math.log(math.exp(a[0]) + math.exp(a[2])) - a[1]
    read = {"query": "q", "kind": "set", "mu": [0.1, 0.2, 0.3], "unsafe": [2, 0, 2]}
    assert read_value(read, P3) == pytest.approx(expected)


def test_pair_read_sign_and_clamp():
    read = {"query": "q", "kind": "pair", "sign": -1}
    assert read_value(read, {("q", None): [0.2, 0.8]}) == pytest.approx(-math.log(0.25))
    assert read_value(read, {("q", None): [0.0, 1.0]}) == pytest.approx(-math.log(1e-6 / (1 - 1e-6)))


# views (§6.3) --------------------------------------------------------------------------------------------------------


def test_views_average_the_per_view_means_and_ignore_reads_without_a_view():
    pack = make_pack({"a": {"aggregate": "views"}})
    pack["reads"] = [
        {"id": "r1", "category": "a", "view": "x"},
        {"id": "r2", "category": "a", "view": "y"},
        {"id": "r3", "category": "a", "view": "x"},
        {"id": "r4", "category": "a", "view": ""},
        {"id": "r5", "category": "a"},
    ]
    z = {"r1": 1.0, "r2": 4.0, "r3": 3.0, "r4": 100.0, "r5": 100.0}
    assert category_macros(pack, z) == {"a": (2.0 + 4.0) / 2}


def test_a_views_category_without_a_viewed_read_fails():
    with pytest.raises(PackEvaluationError, match="view"):
        evaluate(make_pack({"a": {"aggregate": "views"}}), answers(a=0.5), lock_ok=True)


# percentile (§6.4) ---------------------------------------------------------------------------------------------------

QUANTILES = {"levels": [0.5, 0.8, 0.9, 0.99], "values": [0.1, 0.2, 0.2, 0.4]}


@pytest.mark.parametrize(
    ("score", "level"), [(0.05, 0.5), (0.1, 0.5), (0.15, 0.65), (0.2, 0.9), (0.3, 0.945), (0.4, 0.99), (0.7, 0.99)]
)
def test_percentile_clamps_interpolates_and_takes_the_last_tied_value(score, level):
    assert percentile(QUANTILES, score) == pytest.approx(level)


def test_no_quantiles_no_percentile():
    assert percentile(None, 0.3) is None


# thresholds, flags and requires (§6.5) -------------------------------------------------------------------------------


def test_a_flag_is_score_at_or_above_the_threshold_and_null_without_one():
    pack = make_pack({"a": {"threshold": 0.3}, "b": {"threshold": None}, "c": {}})
    score = evaluate(pack, answers(a=0.3, b=0.9, c=0.9), lock_ok=True)["categories"]["a"]["score"]
    pack["categories"]["a"]["threshold"] = score
    assert flags(pack, {"a": 0.3, "b": 0.9, "c": 0.9}) == {"a": True, "b": None, "c": None}


def test_call_thresholds_replace_the_packs_null_included():
    pack = make_pack({"a": {"threshold": 0.9}, "b": {"threshold": 0.1}, "c": {}})
    assert flags(pack, {"a": 0.5, "b": 0.5, "c": 0.5}, thresholds={"a": 0.4, "b": None, "c": 0.6}) == {
        "a": True,
        "b": None,
        "c": False,
    }


def test_an_unknown_category_in_thresholds_fails():
    with pytest.raises(PackEvaluationError, match="nope"):
        decide(make_pack({"a": {}}), {"a": 0.5}, thresholds={"nope": 0.1})


def test_requires_reads_the_flags_as_they_stand_in_pack_order():
    chain = {"threshold": 0.1}
    forward = make_pack(
        {"a": {**chain, "requires": ["b"]}, "b": {**chain, "requires": ["c"]}, "c": {"threshold": 0.9}}
    )
    scores = {"a": 0.5, "b": 0.5, "c": 0.5}
    # a is checked while b still stands flagged; b is then unflagged by c
    assert flags(forward, scores) == {"a": True, "b": False, "c": False}
    backward = make_pack(
        {"c": {"threshold": 0.9}, "b": {**chain, "requires": ["c"]}, "a": {**chain, "requires": ["b"]}}
    )
    assert flags(backward, scores) == {"c": False, "b": False, "a": False}


def test_requires_counts_a_null_flag_as_not_flagged():
    pack = make_pack({"a": {"threshold": 0.1, "requires": ["b"]}, "b": {}})
    assert flags(pack, {"a": 0.5, "b": 0.9}) == {"a": False, "b": None}


# the modes offered (§1.9) and the lock gate (§6.6.1) ----------------------------------------------------------------

LINEAR = {"inputs": ["c:a", "r:r_b"], "weights": float32s(0.5, -2.0, 0.125, 0.25), "lock": "sha256:x"}
BOTH = {"a": {"threshold": 0.3}, "b": {"threshold": 0.6}}


def test_modes_offered_in_the_specs_order():
    full = make_pack(BOTH, {"mode": "micro_layer", "max": {"threshold": 0.5}, "micro_layer": LINEAR})
    assert modes_of(full) == ["max", "per_category", "micro_layer"]
    assert modes_of(make_pack(BOTH, {"mode": "per_category", "max": {}, "micro_layer": {}})) == ["per_category"]


def test_an_unknown_mode_fails():
    with pytest.raises(PackEvaluationError, match="bogus"):
        decide(make_pack(BOTH), {"a": 0.5, "b": 0.5}, mode="bogus")


@pytest.mark.parametrize(
    ("decision", "lock_ok", "used"),
    [
        ({"mode": "micro_layer", "micro_layer": LINEAR}, False, "per_category"),
        ({"mode": "micro_layer", "micro_layer": LINEAR, "fallback": "max", "max": {"threshold": 0.9}}, False, "max"),
        ({"mode": "per_category", "micro_layer": {}}, True, "per_category"),
    ],
    ids=["broken-lock-default-fallback", "broken-lock-max-fallback", "empty-micro-layer"],
)
def test_micro_layer_falls_back_with_a_warning_and_ignores_the_call_threshold(decision, lock_ok, used):
    got = decide(make_pack(BOTH, decision), {"a": 0.5, "b": 0.1}, lock_ok=lock_ok, mode="micro_layer", threshold=0.01)
    assert got.pop("warning").startswith("the micro-layer lock does not match")
    if used == "max":
        assert got == {"unsafe": False, "mode": "max", "score": pytest.approx(0.5), "threshold": 0.9, "category": "a"}
    else:
        assert got == {"unsafe": True, "mode": "per_category", "categories": ["a"]}


# micro_layer (§6.6.2) ------------------------------------------------------------------------------------------------


def micro_pack(micro: dict) -> dict:
    return make_pack(BOTH, {"mode": "micro_layer", "micro_layer": micro})


def test_linear_micro_layer():
    got = decide(micro_pack(LINEAR), {"a": 0.5, "b": 0.75})
    x = [0.0, math.log(3.0)]  # the macro of a (logit 0.5) and the z of r_b (logit 0.75)
    value = x[0] * 0.5 + x[1] * -2.0 + 0.125
    assert got == {"unsafe": False, "mode": "micro_layer", "score": pytest.approx(value), "threshold": 0.25}


def test_hidden_micro_layer():
    # W1 = [[0.5, -1], [2, 0.25]] (row-major by input), b1 = [0.125, -0.5], w2 = [1, -2], b2 = 0.5, threshold -3
    weights = float32s(0.5, -1.0, 2.0, 0.25, 0.125, -0.5, 1.0, -2.0, 0.5, -3.0)
    got = decide(micro_pack({**LINEAR, "hidden": 2, "weights": weights}), {"a": 0.5, "b": 0.75})
    x = [0.0, math.log(3.0)]
    u = [math.tanh(x[0] * 0.5 + x[1] * 2.0 + 0.125), math.tanh(x[0] * -1.0 + x[1] * 0.25 - 0.5)]
    value = u[0] * 1.0 + u[1] * -2.0 + 0.5
    assert got == {"unsafe": True, "mode": "micro_layer", "score": pytest.approx(value), "threshold": -3.0}


def test_a_call_threshold_replaces_the_stored_one_and_equality_is_unsafe():
    value = decide(micro_pack(LINEAR), {"a": 0.5, "b": 0.75})["score"]
    got = decide(micro_pack(LINEAR), {"a": 0.5, "b": 0.75}, threshold=value)
    assert (got["unsafe"], got["threshold"]) == (True, value)
    assert decide(micro_pack(LINEAR), {"a": 0.5, "b": 0.75}, threshold=-1)["threshold"] == -1.0


@pytest.mark.parametrize(
    ("micro", "match"),
    [
        ({**LINEAR, "weights": float32s(1.0, 2.0)}, "2 weights"),
        ({**LINEAR, "weights": "not base64!"}, "base64"),
        ({**LINEAR, "weights": base64.b64encode(bytes(5)).decode()}, "multiple of 4"),
        ({**LINEAR, "inputs": ["c:a", "r:zz"]}, "r:zz"),
    ],
)
def test_a_micro_layer_that_cannot_run_fails(micro, match):
    with pytest.raises(PackEvaluationError, match=match):
        decide(micro_pack(micro), {"a": 0.5, "b": 0.5})


# max (§6.6.3) --------------------------------------------------------------------------------------------------------

MAX = {"mode": "max", "max": {"threshold": 0.5}}


def test_max_takes_the_highest_deciding_score_and_ties_go_to_the_first():
    pack = make_pack(
        {"a": {"threshold": 0.1}, "b": {"threshold": 0.1}, "c": {"threshold": 0.1, "decides": False}}, MAX
    )
    assert decide(pack, {"a": 0.4, "b": 0.6, "c": 0.9})["category"] == "b"
    tied = decide(pack, {"a": 0.6, "b": 0.6, "c": 0.9})
    assert tied == {"unsafe": True, "mode": "max", "score": pytest.approx(0.6), "threshold": 0.5, "category": "a"}


def test_max_without_deciding_categories_is_safe_with_no_category():
    pack = make_pack({"a": {"threshold": None}, "b": {"threshold": 0.1, "decides": False}}, MAX)
    got = decide(pack, {"a": 0.9, "b": 0.9}, threshold=0.0)
    assert got == {"unsafe": False, "mode": "max", "score": 0.0, "threshold": 0.0, "category": None}


def test_max_at_its_threshold_is_unsafe_and_a_call_threshold_is_a_float():
    pack = make_pack({"a": {"threshold": 0.9}}, MAX)
    score = decide(pack, {"a": 0.3})["score"]
    assert decide(pack, {"a": 0.3}, threshold=score)["unsafe"] is True
    got = decide(pack, {"a": 0.3}, threshold=1)
    assert (got["unsafe"], got["threshold"], type(got["threshold"])) == (False, 1.0, float)


def test_a_stored_integer_max_threshold_stays_an_integer_in_the_entry():
    pack = make_pack({"a": {"threshold": 0.9}}, {"mode": "max", "max": {"threshold": 1}})
    entry = pack_entry(pack, "plain", evaluate(pack, answers(a=0.3), lock_ok=True))
    assert entry["decision"] == {"unsafe": False, "mode": "max", "score": 0.3, "threshold": 1, "category": "a"}
    assert type(entry["decision"]["threshold"]) is int


def test_max_without_decision_max_fails():
    with pytest.raises(PackEvaluationError, match="max"):
        decide(make_pack(BOTH), {"a": 0.5, "b": 0.5}, mode="max")


# per_category (§6.6.4) -----------------------------------------------------------------------------------------------


def test_per_category_lists_the_flagged_deciding_categories_in_pack_order():
    pack = make_pack({"b": {"threshold": 0.2}, "a": {"threshold": 0.2}, "c": {"threshold": 0.2, "decides": False}})
    got = decide(pack, {"a": 0.5, "b": 0.5, "c": 0.5}, threshold=0.99)
    assert got == {"unsafe": True, "mode": "per_category", "categories": ["b", "a"]}
    assert decide(pack, {"a": 0.1, "b": 0.1, "c": 0.5}) == {"unsafe": False, "mode": "per_category", "categories": []}


# critical (§6.6.5) ---------------------------------------------------------------------------------------------------

CRITICAL = {"a": {"threshold": 0.2, "decides": False}, "b": {"threshold": 0.2}, "c": {"threshold": 0.9}}


@pytest.mark.parametrize(
    ("call", "extra"),
    [
        ({}, {"critical": ["a"], "by": "critical"}),
        ({"critical": []}, {}),
        ({"critical": ["c", "nope", "a", "a"]}, {"critical": ["a", "a"], "by": "critical"}),
    ],
    ids=["pack-list", "none", "call-list"],
)
def test_the_critical_rule_makes_a_safe_decision_unsafe(call, extra):
    pack = make_pack(CRITICAL, {"mode": "per_category", "critical": ["a", "c"]})
    got = decide(pack, {"a": 0.5, "b": 0.1, "c": 0.5}, **call)
    assert got == {"unsafe": bool(extra), "mode": "per_category", "categories": [], **extra}


def test_the_critical_rule_on_an_unsafe_decision_adds_no_by():
    pack = make_pack(CRITICAL, {"mode": "per_category", "critical": ["a"]})
    got = decide(pack, {"a": 0.5, "b": 0.5, "c": 0.5})
    assert got == {"unsafe": True, "mode": "per_category", "categories": ["b"], "critical": ["a"]}


def test_critical_comes_before_the_warning():
    decision = {"mode": "micro_layer", "micro_layer": LINEAR, "critical": ["a"]}
    got = decide(make_pack(BOTH, decision), {"a": 0.5, "b": 0.1}, lock_ok=False)
    assert list(got) == ["unsafe", "mode", "categories", "critical", "warning"]
