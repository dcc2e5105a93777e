"""The engine against an independent plain transformers forward pass of each prompt (engine spec A.6–A.9).

Hypothesis draws requests with contents from empty to several hundred tokens (longer than the tiny model's
32-token window), 1 to 40 queries, placeholders and grids, options of 1 to 5 tokens, the case rule on and off,
several inputs, and templates that merge with the content's end (forcing the cut).

The oracle's cost grows with contents x prompts x option tokens, so the two runs split the work. The default run
checks the chosen bodies of `CHOSEN` (one corner each: the cut, empty content and floors, grids and long options,
several inputs, many queries over a long content) and a few drawn bodies of bounded size, derandomized so that
every run checks the same bodies in the same time. The ``slow`` run (``pytest -m slow``, which CI runs after the
default run) draws fresh bodies of every size each time.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, example, given, settings
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
# Hypothesis' defaults for every run; a body can take seconds, so no deadline
BASE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


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
def requests(draw, *, shared_counts=(0, 1, 4, 12, 37), sizes=(0, 20, 150, 320)):
    num_inputs = draw(st.integers(1, 3))
    shared = draw(queries("s", draw(st.sampled_from(shared_counts))))
    inputs = []
    for i in range(num_inputs):
        size = draw(st.sampled_from(sizes))
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


def text_input(input_id: str, text: str, **fields) -> dict:
    return {"id": input_id, "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}], **fields}


def words(count: int, start: int = 0) -> str:
    return " ".join(WORDS[(start + 7 * k) % len(WORDS)] for k in range(count))


YES_NO = [" yes", " no"]
CHOSEN = {
    # the content ends inside a word and the templates go on with it ("order" + "ing", "order" + "s"), so the
    # engine must cut the content and read its tail again with each template; more than 256 characters
    "the cut": {
        "inputs": [text_input("in0", words(150) + " order")],
        "scoring": {
            "queries": [
                {"id": "ing", "template": "ing the message? Answer:{?}", "options": YES_NO},
                {"id": "s", "template": "s and the message:{?}", "options": [" maybe", " yes"]},
                {"id": "plain", "template": "\n\nQuestion: the message?{?}", "options": YES_NO},
            ]
        },
    },
    # no content; floors off for the request but on for one query; the case rule off (one spelling per option)
    "empty content and floors": {
        "inputs": [text_input("in0", "")],
        "scoring": {
            "queries": [
                {
                    "id": "on",
                    "template": "\n\nDoes it mention the message? Answer:{?}",
                    "options": YES_NO,
                    "empty_floor": True,
                },
                {"id": "off", "template": " Is the message?{?}", "options": [" positive", " negative"]},
            ],
            "empty_floor": False,
            "case_insensitive": False,
        },
    },
    # a full grid over two placeholders and a list of combinations; options of several tokens, one without a
    # leading space, and the case rule adding spellings
    "grids and long options": {
        "inputs": [text_input("in0", words(20, 3) + ".")],
        "scoring": {
            "queries": [
                {
                    "id": "grid",
                    "template": "\nthe message about {x} about {y}? Answer:{?}",
                    "options": [" very much so", " not at all", " unclear from the text"],
                    "combinations": "all",
                    "values": {"x": ["refund", "money"], "y": ["late", "broken"]},
                },
                {
                    "id": "rows",
                    "template": " Is the message about {x}:{?}",
                    "options": ["yes", " Refund"],
                    "combinations": [{"x": "card"}, {"x": "bank"}, {"x": "store"}],
                },
            ],
            "case_insensitive": True,
        },
    },
    # several inputs of other sizes sharing queries, some picked by query_ids, one input with its own query only
    "several inputs": {
        "inputs": [
            text_input("in0", words(20, 5) + "!"),
            text_input("in1", words(150, 2) + " and", query_ids=["s1"]),
            text_input(
                "in2",
                "",
                query_ids=["s0"],
                queries=[{"id": "own", "template": "\n\nQuestion: the message?{?}", "options": YES_NO}],
            ),
        ],
        "scoring": {
            "queries": [
                {"id": "s0", "template": "\n\nQuestion: the message? Answer:{?}", "options": [" True", " no"]},
                {"id": "s1", "template": "ing the message?{?}", "options": [" maybe", " yes", " no"]},
            ],
            "case_insensitive": True,
        },
    },
    # many queries (6-40) over a long content: every sliding window and the global layers
    "many queries": {
        "inputs": [text_input("in0", words(320, 1) + ".")],
        "scoring": {
            "queries": [
                {
                    "id": f"q{k}",
                    "template": f"{TEMPLATE_STARTS[k % 7]}the message{TEMPLATE_ENDS[k % 4]}{{?}}",
                    "options": [OPTIONS[k % 11], OPTIONS[(k + 3) % 11]],
                }
                for k in range(12)
            ]
        },
    },
}


def check_body(engine, oracle, body: dict) -> None:
    response = engine.score(body)
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


def with_chosen(test):
    for body in reversed(CHOSEN.values()):
        test = example(body=body)(test)
    return test


@settings(BASE, max_examples=20, derandomize=True, database=None)
@given(body=requests(shared_counts=(0, 1, 4), sizes=(0, 20, 150)))
@with_chosen
def test_scores_match_plain_transformers(tiny_engine, oracle, body):
    check_body(tiny_engine, oracle, body)


@pytest.mark.slow
@settings(BASE, max_examples=250)  # about 2 minutes on 2 cores; fresh bodies every run, so the runs add up
@given(body=requests())
def test_scores_match_plain_transformers_at_length(tiny_engine, oracle, body):
    check_body(tiny_engine, oracle, body)


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
