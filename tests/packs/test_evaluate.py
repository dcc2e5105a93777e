"""The pack evaluator on the test vectors of packs spec §2 and §9, and one targeted test per branch of §6."""

from __future__ import annotations

import pytest

from spinf.packs.evaluate import answers_from_queries, evaluate, modes_of, pack_entry
from spinf.packs.pipeline import category_macros, read_value, read_z
from tests.packs.tone_vectors import MINIMAL, RESULT, TONE, tone_broken_lock, tone_hidden, tone_logprob

ANSWERS_P = answers_from_queries(TONE, RESULT["queries"])


def run(pack, *, lock_ok=True, **call):
    return evaluate(pack, answers_from_queries(pack, RESULT["queries"]), lock_ok=lock_ok, **call)


def approx(value):
    return pytest.approx(value, rel=0, abs=1e-12)


# §9.3: answers "p" ---------------------------------------------------------------------------------------------------


def test_tone_answers_are_the_options_p():
    assert ANSWERS_P == {
        ("rude", None): [0.3, 0.7],
        ("tone", None): [0.6, 0.25, 0.15],
        ("aimed", "a person"): [0.4, 0.6],
        ("aimed", "a group"): [0.0, 1.0],
    }


@pytest.mark.parametrize(
    ("index", "v", "z"),
    [
        (0, -0.8472978603872036, 0.7684680930751977),
        (1, 2.112280280517757, 2.5935669004314645),
        (2, -0.4054651081081643, 0.29726744594591786),
        (3, -13.815509557963773, -6.157754778981887),
    ],
)
def test_tone_reads(index, v, z):
    read = TONE["reads"][index]
    assert read_value(read, ANSWERS_P) == approx(v)
    assert read_z(TONE, ANSWERS_P)[read["id"]] == approx(z)


def test_tone_macros():
    macros = category_macros(TONE, read_z(TONE, ANSWERS_P))
    assert macros == {"rudeness": approx(1.6810174967533311), "targeted": approx(-2.9302436665179843)}


def test_tone_categories():
    assert run(TONE)["categories"] == {
        "rudeness": {"score": approx(0.2403282465861113), "percentile": approx(0.909073855481875), "flagged": False},
        "targeted": {"score": approx(0.00583969846579057), "percentile": None, "flagged": None},
    }


@pytest.mark.parametrize(
    ("call", "decision"),
    [
        ({}, {"unsafe": False, "mode": "micro_layer", "score": -0.8897673787336243, "threshold": 0.25}),
        (
            {"mode": "max"},
            {"unsafe": False, "mode": "max", "score": 0.2403282465861113, "threshold": 0.5, "category": "rudeness"},
        ),
        (
            {"mode": "max", "threshold": 0.2, "critical": []},
            {"unsafe": True, "mode": "max", "score": 0.2403282465861113, "threshold": 0.2, "category": "rudeness"},
        ),
        (
            {"mode": "per_category", "thresholds": {"rudeness": 0.2, "targeted": 0.005}},
            {"unsafe": True, "mode": "per_category", "categories": ["rudeness", "targeted"], "critical": ["rudeness"]},
        ),
        (
            {"thresholds": {"rudeness": 0.2}},
            {
                "unsafe": True,
                "mode": "micro_layer",
                "score": -0.8897673787336243,
                "threshold": 0.25,
                "critical": ["rudeness"],
                "by": "critical",
            },
        ),
    ],
)
def test_tone_decisions(call, decision):
    got = run(TONE, **call)["decision"]
    assert list(got) == list(decision)
    assert got == {key: approx(value) if isinstance(value, float) else value for key, value in decision.items()}


def test_tone_server_entry():
    assert pack_entry(TONE, "chat", run(TONE)) == {
        "id": "acme/tone",
        "version": "1.0.0",
        "context": "chat",
        "categories": {
            "rudeness": {"score": 0.240328, "percentile": 0.909074, "flagged": False},
            "targeted": {"score": 0.00584, "percentile": None, "flagged": None},
        },
        "decision": {"unsafe": False, "mode": "micro_layer", "score": -0.889767, "threshold": 0.25},
    }


@pytest.mark.parametrize("call", [{}, {"threshold": 0.9}])
def test_tone_broken_lock_falls_back_to_max_with_the_packs_threshold(call):
    decision = run(tone_broken_lock(), lock_ok=False, **call)["decision"]
    warning = decision.pop("warning")
    assert "lock" in warning and "max" in warning
    assert decision == {
        "unsafe": False,
        "mode": "max",
        "score": approx(0.23369786464012873),
        "threshold": 0.5,
        "category": "rudeness",
    }
    entry = pack_entry(tone_broken_lock(), "chat", run(tone_broken_lock(), lock_ok=False, **call))
    assert entry["decision"]["score"] == 0.233698


# §9.4: answers "logprob" ---------------------------------------------------------------------------------------------


def test_tone_logprob_answers():
    answers = answers_from_queries(tone_logprob(), RESULT["queries"])
    assert answers[("rude", None)] == [approx(0.29943285752602705), approx(0.7005671424739729)]
    assert answers[("aimed", "a group")] == [approx(1.1253516205509495e-07), approx(0.9999998874648379)]


def test_tone_logprob_evaluation():
    out = run(tone_logprob())
    assert out["categories"]["rudeness"]["score"] == approx(0.2385508542285045)
    assert out["categories"]["rudeness"]["percentile"] == approx(0.9086739422014135)
    assert out["categories"]["targeted"]["score"] == approx(0.005846841653079961)
    assert out["decision"] == {
        "unsafe": False,
        "mode": "micro_layer",
        "score": approx(-0.8967229388192601),
        "threshold": 0.25,
    }


# §9.5: the hidden-layer variant --------------------------------------------------------------------------------------


def test_hidden_variant_macros_and_categories():
    pack = tone_hidden()
    answers = answers_from_queries(pack, RESULT["queries"])
    assert category_macros(pack, read_z(pack, answers)) == {
        "rudeness": approx(1.672144658566644),
        "targeted": approx(-2.9288773894909435),
    }
    assert run(pack)["categories"] == {
        "rudeness": {"score": approx(0.2385508542285045), "percentile": approx(0.9086739422014135), "flagged": False},
        # at or above its 0.004 threshold, but it requires rudeness, which is not flagged
        "targeted": {"score": approx(0.005846841653079961), "percentile": None, "flagged": False},
    }


def test_hidden_variant_default_decision():
    assert run(tone_hidden())["decision"] == {
        "unsafe": True,
        "mode": "micro_layer",
        "score": approx(0.5583522541577381),
        "threshold": 0.0,
    }


def test_hidden_variant_max_decides_on_targeted_only():
    assert run(tone_hidden(), mode="max")["decision"] == {
        "unsafe": False,
        "mode": "max",
        "score": approx(0.005846841653079961),
        "threshold": 0.5,
        "category": "targeted",
    }


def test_hidden_variant_per_category_with_the_critical_rule_on_a_non_deciding_category():
    out = run(tone_hidden(), mode="per_category", thresholds={"rudeness": 0.2})
    assert [values["flagged"] for values in out["categories"].values()] == [True, True]
    assert out["decision"] == {
        "unsafe": True,
        "mode": "per_category",
        "categories": ["targeted"],
        "critical": ["rudeness"],
    }


# §2: the minimal pack ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "score", "entry", "decision"),
    [
        ([0.1, 0.9], 0.05892069983104744, {"score": 0.058921, "percentile": None, "flagged": False}, []),
        ([0.98, 0.02], 0.7991172966306965, {"score": 0.799117, "percentile": None, "flagged": True}, ["off_topic"]),
    ],
)
def test_minimal_pack(p, score, entry, decision):
    out = evaluate(MINIMAL, {("on_topic", None): p}, lock_ok=False)
    assert out["categories"]["off_topic"]["score"] == approx(score)
    built = pack_entry(MINIMAL, "support", out)
    assert built["categories"] == {"off_topic": entry}
    assert built["decision"] == {"unsafe": bool(decision), "mode": "per_category", "categories": decision}
    assert modes_of(MINIMAL) == ["per_category"]
