"""The engine against an independent plain transformers forward pass of each prompt (engine spec A.6–A.9).

Hypothesis draws requests with contents from empty to several hundred tokens (longer than the tiny model's
32-token window), 1 to 40 queries, placeholders and grids, options of 1 to 5 tokens, the case rule on and off,
several inputs, and templates that merge with the content's end (forcing the cut).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.engine.oracle import Oracle, derived

WORDS = (
    "the customer order refund money charged twice happy service delivery late product broken great price support "
    "account please thanks issue again today never always payment card bank store manager email Monday report "
    "shipping address wrong item box damaged quickly slow answer"
).split()
OPTIONS = (
    " yes",
    " no",
    " maybe",
    " positive",
    " negative",
    " very much so",
    " not at all",
    " True",
    " unclear from the text",
    " Refund",
    "yes",
)
TEMPLATE_STARTS = ("\n\nQuestion: ", " Is the ", "s and ", "\n", "", "\n\nDoes it mention ", "ing ")
TEMPLATE_ENDS = ("? Answer:", " Answer:", ":", "?")
TOLERANCE = 1e-4


@st.composite
def queries(draw, prefix: str, count: int):
    out = []
    for k in range(count):
        names = draw(st.lists(st.sampled_from(["x", "y"]), max_size=2, unique=True))
        middle = "".join(" about {" + n + "}" for n in names)
        template = draw(st.sampled_from(TEMPLATE_STARTS)) + "the message" + middle
        template += draw(st.sampled_from(TEMPLATE_ENDS)) + "{?}"
        q = {"id": f"{prefix}{k}", "template": template}
        options = draw(
            st.lists(st.sampled_from(OPTIONS), min_size=1, max_size=4, unique_by=lambda o: o.strip().lower())
        )
        q["options"] = options
        if names and draw(st.booleans()):
            q["combinations"] = "all"
            q["values"] = {
                n: draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=2, unique=True)) for n in names
            }
        elif names:
            rows = draw(st.lists(st.tuples(*[st.sampled_from(WORDS) for _ in names]), min_size=1, max_size=3))
            q["combinations"] = [dict(zip(names, row, strict=True)) for row in rows]
        q["empty_floor"] = draw(st.sampled_from([None, True, False]))
        out.append(q)
    return out


@st.composite
def requests(draw):
    num_inputs = draw(st.integers(1, 3))
    shared = draw(queries("s", draw(st.sampled_from([0, 1, 4, 12, 37]))))
    inputs = []
    for i in range(num_inputs):
        size = draw(st.sampled_from([0, 20, 150, 320]))
        words = draw(st.lists(st.sampled_from(WORDS), min_size=size, max_size=size))
        text = " ".join(words) + draw(st.sampled_from(["", ".", " and", "!"]))
        own = draw(queries(f"i{i}q", draw(st.integers(0 if shared else 1, 3))))
        inp = {"id": f"in{i}", "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
        if own:
            inp["queries"] = own
        if shared and draw(st.booleans()):
            inp["query_ids"] = draw(st.lists(st.sampled_from([q["id"] for q in shared]), unique=True))
            if not inp["query_ids"] and not own:
                inp["query_ids"] = [shared[0]["id"]]
        inputs.append(inp)
    scoring = {"queries": shared, "case_insensitive": draw(st.booleans())}
    if draw(st.booleans()):
        scoring["empty_floor"] = draw(st.booleans())
    return {"inputs": inputs, "scoring": scoring}


@pytest.fixture(scope="module")
def oracle(tiny_engine):
    return Oracle(tiny_engine.folder)


def chosen_queries(body: dict, inp: dict) -> list[dict]:
    shared = body["scoring"]["queries"]
    ids = inp.get("query_ids")
    picked = shared if ids is None else [next(q for q in shared if q["id"] == i) for i in ids]
    return picked + inp.get("queries", [])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=requests())
def test_scores_match_plain_transformers(tiny_engine, oracle, body):
    response = tiny_engine.score(body)
    for inp, result in zip(body["inputs"], response["results"], strict=True):
        text = inp["messages"][0]["content"][0]["text"]
        wanted = chosen_queries(body, inp)
        expected = oracle.score_input(text, wanted, body["scoring"])
        event(f"content tokens > window: {len(oracle.tok(text)) > 32}")
        event(f"queries: {'1-5' if len(wanted) <= 5 else '6-40'}")
        assert [q["id"] for q in result["queries"]] == [q["id"] for q in wanted]
        for got_query, combos in zip(result["queries"], expected, strict=True):
            for got, (main, floor) in zip(got_query["combinations"], combos, strict=True):
                check_combination(got, main, floor)


def check_combination(got: dict, main: list[float], floor: list[float] | None) -> None:
    ps, residual = derived(main)
    assert abs(got["residual"] - residual) <= TOLERANCE
    for option, lp, p in zip(got["options"], main, ps, strict=True):
        assert abs(option["logprob"] - lp) <= TOLERANCE, (option, lp)
        assert abs(option["p"] - p) <= TOLERANCE
    if floor is None:
        assert got["floor_residual"] is None
        assert all(o["floor_p"] is None for o in got["options"])
        return
    floor_ps, floor_residual = derived(floor)
    assert abs(got["floor_residual"] - floor_residual) <= TOLERANCE
    for option, p in zip(got["options"], floor_ps, strict=True):
        assert abs(option["floor_p"] - p) <= TOLERANCE
