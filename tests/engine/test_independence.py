"""A question's numbers do not depend on what else is scored with it (engine spec C.1; bitwise on the GPU).

On the CPU the tolerance is 1e-6 on the 6-decimal outputs: a question alone, with 300 other questions, with other
inputs in the same call, and in another order, and when its input's job is split into several pieces.
"""

from __future__ import annotations

import random

import pytest

from spinf import Engine
from spinf.engine.loop import Call

CONTENT = (
    "The harbour authority said on Tuesday that two cargo ships had been held outside the port for a week, after "
    "a dispute over fees with the shipping company. Prices of fuel in the region rose by four percent. "
) * 3
TARGETS = [
    {
        "id": "rise",
        "template": "\n\nAfter this news, {F} will probably{?}",
        "options": [" rise", " fall"],
        "combinations": "all",
        "values": {"F": ["fuel prices", "the port fees", "shipping costs"]},
    },
    {
        "id": "multi",
        "template": "\n\nThe article is mostly about",
        "options": [" money", " the harbour", " the license terms"],
    },
    {"id": "case", "template": "\n\nIs the port closed? Answer:{?}", "options": [" yes", " no", " not at all"]},
]
TARGETS[1]["template"] += "{?}"
TOL = 1.0000001e-6


def other_questions(n: int) -> list[dict]:
    rng = random.Random(7)
    words = CONTENT.replace(",", "").replace(".", "").split()
    out = []
    for k in range(n):
        phrase = " ".join(rng.sample(words, 3))
        out.append(
            {"id": f"o{k}", "template": f"\n\nDoes it mention {phrase}? Answer:{{?}}", "options": [" yes", " no"]}
        )
    return out


def numbers(response: dict, input_id: str = "a") -> dict:
    result = next(r for r in response["results"] if r["input_id"] == input_id)
    out = {}
    for q in result["queries"]:
        if q["id"] in {t["id"] for t in TARGETS}:
            for k, combo in enumerate(q["combinations"]):
                for o in combo["options"]:
                    out[(q["id"], k, o["text"])] = (o["logprob"], o["p"], o["floor_p"])
                out[(q["id"], k, "residual")] = (combo["residual"], combo["floor_residual"])
    return out


def body(queries: list[dict], inputs: list[tuple[str, str]]) -> dict:
    return {
        "inputs": [{"id": i, "messages": [{"role": "user", "content": text}]} for i, text in inputs],
        "scoring": {"queries": queries},
    }


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        for x, y in zip(a[key], b[key], strict=True):
            assert abs(x - y) <= TOL, (key, x, y)


@pytest.fixture(scope="module")
def alone(tiny_engine):
    return numbers(tiny_engine.score(body(TARGETS, [("a", CONTENT)])))


def test_each_question_alone_equals_all_together(tiny_engine, alone):
    singles = {}
    for target in TARGETS:
        singles.update(numbers(tiny_engine.score(body([target], [("a", CONTENT)]))))
    assert_same(singles, alone)


def test_with_300_other_questions(tiny_engine, alone):
    crowded = tiny_engine.score(body(other_questions(300) + TARGETS, [("a", CONTENT)]))
    assert_same(numbers(crowded), alone)


def test_with_other_inputs_and_in_another_order(tiny_engine, alone):
    queries = other_questions(40) + TARGETS
    random.Random(3).shuffle(queries)
    inputs = [("z", "A short note about something else entirely."), ("a", CONTENT), ("y", CONTENT[:90])]
    assert_same(numbers(tiny_engine.score(body(queries, inputs))), alone)


def test_when_the_input_is_split_into_pieces(tiny_cache, alone):
    small = Engine("tiny", cache_dir=tiny_cache, token_budget=384, max_tokens=1024)
    response = small.score(body(other_questions(60) + TARGETS, [("a", CONTENT)]))
    assert_same(numbers(response), alone)


def test_when_another_request_shares_the_passes(tiny_engine, alone, monkeypatch):
    # one pass by the token budget: the CPU's time bound (max_pass_s) would cut it by the measured pace
    monkeypatch.setattr(tiny_engine.loop.scheduler, "max_pass_s", 0.0)
    mine = Call(body(TARGETS, [("a", CONTENT)]), "scr_mine")
    other = Call(body(other_questions(80), [("b", CONTENT[:200]), ("c", "Nothing to see.")]), "scr_other")
    passes = tiny_engine.loop.statistics().passes
    tiny_engine.loop.run([mine, other])
    assert tiny_engine.loop.statistics().passes == passes + 1 and other.unwrap()["results"]  # one shared pass
    assert_same(numbers(mine.unwrap()), alone)
