"""Extraction in the engine loop: a slot's outcome does not depend on what shares its call, its passes or its decode
(fp32 on the CPU is batch-invariant, so the comparisons are exact), and the limits, budgets and usage fields of api
spec §4.5, §4.9 and §5.7 for extraction slots.

Compositions compared with each slot alone: all the slots of an input together, with other slots and scored
queries, with other inputs, with concurrent calls sharing the loop's passes and decode (and not sharing them),
decoded in chunks of one slot (a small decoder budget) and decoded early (a decode budget the held captures pass).
"""

from __future__ import annotations

import pytest

from spinf import Engine
from spinf.engine.extraction import decoder
from spinf.engine.loop import Call
from spinf.errors import ApiError
from spinf.settings import Limits
from tests.engine.extraction.probe import outcomes

CONTENT = "Order 7 of the shop: the parcel came late and the box was open, said the customer Alice Smith."
TARGETS = [
    {"id": "t", "template": '\n\nName: "{*}"', "max_tokens": 6},
    {"id": "n", "template": "\n\nOrder number:{n}", "max_tokens": 4},
    {"id": "c", "template": "\n\nPrice:{$}", "max_tokens": 3, "top_k": 3, "calibration": {"a": 2}},
    {"id": "g", "template": "\n\nSummary:{*}", "generate": True, "max_tokens": 6},
    {"id": "r", "template": "\n\nSummary:{*}", "max_tokens": 5, "generate": {"temperature": 0.9, "n": 5, "seed": 3}},
    {
        "id": "w",
        "template": "\n\nThe {who} is {*}.",
        "combinations": [{"who": "customer"}, {"who": "shop"}],
        "max_tokens": 5,
    },
]
TARGET_IDS = [q["id"] for q in TARGETS]
OTHERS = [
    {"id": "x1", "template": "\n\nCity:{*},", "max_tokens": 7},
    {"id": "x2", "template": "\n\nThe total is{$}", "max_tokens": 5},
    {"id": "x3", "template": "\n\nReply:{*}", "generate": {"temperature": 1.5, "n": 2, "seed": 99}, "max_tokens": 6},
]
SCORED = [
    {"id": "s1", "template": "\n\nIs the box open? Answer:{?}", "options": [" yes", " no"]},
    {"id": "s2", "template": '\n\nName: "{?}', "options": ["Alice", "Bob Smith"]},
]
CONTENT_STOPS = "The customer Alice Smith wrote about order 12345."  # greedy stops at once after "The name is"
OTHER_TEXT = "Hello there. The meeting is on Monday at 10 am in room 4, not 5."


def call_body(inputs: list[tuple[str, str, list[dict]]], shared: list[dict] | None = None) -> dict:
    return {
        "inputs": [
            {"id": i, "messages": [{"role": "user", "content": text}], "queries": queries}
            for i, text, queries in inputs
        ],
        "scoring": {"queries": shared or []},
    }


def targets_of(response: dict, input_id: str = "a") -> dict:
    result = next(r for r in response["results"] if r["input_id"] == input_id)
    return {q["id"]: q for q in result["queries"] if q["id"] in TARGET_IDS}


def raw_of(found: dict, input_id: str = "a", request_id: str | None = None) -> dict:
    return {
        (q, k): decoded
        for (rid, i, q, k), (decoded, _) in found.items()
        if i == input_id and q in TARGET_IDS and request_id in (None, rid)
    }


def run(engine_or_loop, body: dict, *, input_id: str = "a"):
    """(the target entries, their raw outcomes) of one call."""
    loop = getattr(engine_or_loop, "loop", engine_or_loop)
    with outcomes(loop) as found:
        response = engine_or_loop.score(body) if hasattr(engine_or_loop, "score") else _run_loop(loop, body)
    return targets_of(response, input_id), raw_of(found, input_id)


def _run_loop(loop, body):
    call = Call(body, "scr_alone")
    loop.run([call])
    return call.unwrap()


@pytest.fixture(scope="module")
def alone(tiny_engine):
    """Each target query alone in its own call."""
    entries, raw = {}, {}
    for q in TARGETS:
        e, r = run(tiny_engine, call_body([("a", CONTENT, [q])]))
        entries.update(e)
        raw.update(r)
    assert set(entries) == set(TARGET_IDS) and len(raw) == len(TARGETS) + 1
    assert any(d.answers for d in raw.values() if d.answers is not None)  # something to compare
    return entries, raw


@pytest.fixture(scope="module")
def per_token(tiny_engine):
    return tiny_engine.extractor.cost.prefix_token


@pytest.fixture(scope="module")
def chunked(tiny_cache):
    """A decoder budget that holds one short slot at a time (a slot's log-probs alone take over 1 MiB)."""
    return Engine("tiny", device="cpu", cache_dir=tiny_cache, decoder_budget_gib=1.6e6 / 2**30)


CAPTURE_TOKENS = 100


@pytest.fixture(scope="module")
def small(tiny_cache, per_token):
    """One input per pass (a 128-token budget and engine maximum), and a decode budget of exactly
    `CAPTURE_TOKENS` tokens of keys and values: below what one pass of the flush inputs holds."""
    gib = CAPTURE_TOKENS * per_token / 2**30
    return Engine("tiny", device="cpu", cache_dir=tiny_cache, token_budget=128, max_tokens=128, decode_budget_gib=gib)


def test_slots_together_equal_each_alone(tiny_engine, alone):
    assert run(tiny_engine, call_body([("a", CONTENT, TARGETS)])) == alone
    shuffled = [TARGETS[k] for k in (4, 2, 0, 5, 3, 1)]
    assert run(tiny_engine, call_body([("a", CONTENT, shuffled)])) == alone


def test_with_other_slots_and_scored_queries(tiny_engine, alone):
    crowded = [OTHERS[0], *TARGETS[:3], SCORED[0], OTHERS[1], *TARGETS[3:], SCORED[1]]
    assert run(tiny_engine, call_body([("a", CONTENT, crowded)])) == alone
    # the same queries shared by every input, with other inputs before and after
    inputs = [("z", OTHER_TEXT, []), ("a", CONTENT, []), ("y", CONTENT[:40], [])]
    assert run(tiny_engine, call_body(inputs, shared=[*SCORED, *TARGETS])) == alone


def test_with_other_inputs_in_the_same_call(tiny_engine, alone):
    inputs = [("z", OTHER_TEXT, OTHERS + TARGETS[:2]), ("a", CONTENT, TARGETS), ("y", CONTENT[:50], SCORED)]
    assert run(tiny_engine, call_body(inputs)) == alone


@pytest.mark.parametrize("share", [True, False], ids=["shared passes", "own passes"])
def test_with_concurrent_calls_sharing_the_loop(tiny_engine, alone, monkeypatch, share):
    loop = tiny_engine.new_loop(share_passes=share, floor_cache=64)
    decodes = []
    plain = tiny_engine.extractor.decode
    monkeypatch.setattr(tiny_engine.extractor, "decode", lambda tasks: decodes.append(len(tasks)) or plain(tasks))
    works = [
        Call(call_body([("b", OTHER_TEXT, OTHERS)], shared=SCORED), "scr_b"),
        Call(call_body([("a", CONTENT, TARGETS)]), "scr_a"),
        Call(call_body([("c", CONTENT, OTHERS[:1] + TARGETS[2:4]), ("d", "Nothing.", SCORED)]), "scr_c"),
    ]
    passes = loop.statistics().passes
    with outcomes(loop) as found:
        loop.run(works)
    responses = [w.unwrap() for w in works]
    assert (targets_of(responses[1]), raw_of(found, "a", "scr_a")) == alone
    assert targets_of(responses[2], "c") == {k: v for k, v in alone[0].items() if k in ("c", "g")}
    if share:  # one pass and one decode for all three calls
        assert loop.statistics().passes == passes + 1 and decodes == [3 + 7 + 3]
    else:
        assert loop.statistics().passes >= passes + 3 and len(decodes) == 3


def test_decoded_in_chunks_of_one_slot(chunked, alone, monkeypatch):
    sizes = []
    plain = decoder.chunks
    monkeypatch.setattr(decoder, "chunks", lambda *a: sizes.append([len(c) for c in plain(*a)]) or plain(*a))
    assert run(chunked, call_body([("a", CONTENT, TARGETS)])) == alone
    assert sizes and max(max(s) for s in sizes) < len(TARGETS) + 1 and max(len(s) for s in sizes) > 1


@pytest.fixture(scope="module")
def split(tiny_cache):
    """A 128-token budget: an input with many slots is split into pieces, each re-sending the content (A.11.1)."""
    return Engine("tiny", device="cpu", cache_dir=tiny_cache, token_budget=128)


def test_in_split_jobs_and_several_passes(split, tiny_engine, alone):
    fields = ["Name", "City", "Street", "Country", "Phone", "Email"]  # templates that share no tokens but "\n\n"
    many = [
        {"id": f"m{k}", "template": f"\n\n{w} is the field; write it out in full words here:{{*}}", "max_tokens": 3}
        for k, w in enumerate(fields)
    ]
    z = OTHER_TEXT + " " + CONTENT + " Kind regards from the whole team, Bob."
    body = call_body([("z", z, many), ("a", CONTENT, TARGETS + many[:2]), ("y", CONTENT[:40], TARGETS[:3])])
    passes = split.loop.statistics().passes
    with outcomes(split.loop) as found:
        response = split.score(body)
    assert split.loop.statistics().passes - passes >= 3
    assert (targets_of(response), raw_of(found)) == alone
    with outcomes(tiny_engine.loop) as whole:
        expected = tiny_engine.score(body)
    assert response["results"] == expected["results"]
    assert {k[1:]: v for k, v in found.items()} == {k[1:]: v for k, v in whole.items()}
    # z was split: its content went into more than one piece, and counts again in processed tokens (A.11.2)
    resent = response["usage"]["processed_tokens"] - expected["usage"]["processed_tokens"]
    assert resent >= len(split.tokenizer.tok(z))


def test_decoded_early_when_the_held_captures_pass_the_decode_budget(small, tiny_engine, alone, monkeypatch):
    """Three inputs in several passes: each pass's capture holds more than the decode budget, so every pass's
    slots are decoded as soon as it is read (the early flush), not once at the end of the call."""
    short = [q for q in TARGETS if q["id"] != "w"]
    # 64, 31 and 62 content tokens: with their templates the three jobs do not fit one 128-token pass, and each
    # pass keeps more than 100 tokens' worth (its keys and values and 32 KiB of log-probs per slot)
    z = OTHER_TEXT + " " + CONTENT + " Kind regards from the whole team, Bob."
    y = CONTENT + " " + OTHER_TEXT + " Thanks a lot for all your help."
    inputs = [("z", z, short[:3]), ("a", CONTENT, short), ("y", y, short[1:4])]
    body = call_body(inputs)
    decodes = []
    plain = small.extractor.decode
    monkeypatch.setattr(small.extractor, "decode", lambda tasks: decodes.append(len(tasks)) or plain(tasks))
    passes = small.loop.statistics().passes
    with outcomes(small.loop) as found:
        response = small.score(body)
    ran = small.loop.statistics().passes - passes
    assert ran >= 2 and len(decodes) == ran  # decoded pass by pass, not once at the end
    expected = tiny_engine.score(body)  # one pass, one decode
    assert response["results"] == expected["results"]
    assert targets_of(response) == {k: v for k, v in alone[0].items() if k != "w"}
    assert raw_of(found) == {key: v for key, v in alone[1].items() if key[0] != "w"}


def test_seeded_sampling_is_reproducible_and_its_own(tiny_engine, alone):
    body = call_body([("a", CONTENT, [TARGETS[4]])])
    first, again = tiny_engine.score(body), tiny_engine.score(body)
    assert first["results"] == again["results"]
    answers = targets_of(first)["r"]["combinations"][0]["answers"]
    assert len(answers) == 5 and len({a["text"] for a in answers}) > 1
    reseeded = {**TARGETS[4], "generate": {**TARGETS[4]["generate"], "seed": 4}}
    other = targets_of(tiny_engine.score(call_body([("a", CONTENT, [reseeded])])))["r"]
    assert other["combinations"][0]["answers"] != answers
    # n sequences are streams (seed, 0), (seed, 1), ...: the first two of n=5 are those of n=2
    two = {**TARGETS[4], "generate": {**TARGETS[4]["generate"], "n": 2}}
    pair = targets_of(tiny_engine.score(call_body([("a", CONTENT, [two])])))["r"]["combinations"][0]["answers"]
    assert pair == answers[:2]


# -- limits and errors ---------------------------------------------------------------------------------------------


def refused(engine, body, code, param, status=400, **flags):
    with pytest.raises(ApiError) as info:
        engine.score(body, **flags)
    error = info.value
    assert (error.status, error.code, error.param) == (status, code, param), error
    return error


def slot(k: int, **extra) -> dict:
    return {"id": f"q{k}", "template": f"\n\nField {k}:{{*}}", "max_tokens": 1, **extra}


def test_too_many_extractions(tiny_engine, tiny_cache):
    pair = {"id": "p", "template": "\n\nField {v}:{*}", "max_tokens": 1, "combinations": [{"v": "a"}, {"v": "b"}]}
    ten = [slot(k) for k in range(8)] + [pair]  # a combination is a slot
    assert len(tiny_engine.score(call_body([("a", CONTENT, ten)]))["results"][0]["queries"]) == 9
    eleven = [*ten, slot(9, generate=True)]  # generated slots count
    refused(tiny_engine, call_body([("a", CONTENT, eleven)]), "too_many_extractions", "inputs.0")
    body = call_body([("a", CONTENT, ten[:2]), ("b", CONTENT, ten[:3])])
    assert tiny_engine.score(body)["results"]
    two = body | {"limits": {"max_extractions_per_input": 2}}
    refused(tiny_engine, two, "too_many_extractions", "inputs.1", trusted=True)
    none = body | {"limits": {"max_extractions_per_input": 0}}
    refused(tiny_engine, none, "too_many_extractions", "inputs.0", trusted=True)
    strict = Engine("tiny", device="cpu", cache_dir=tiny_cache, limits=Limits(max_extractions_per_input=2))
    refused(strict, body, "too_many_extractions", "inputs.1")
    assert strict.score(call_body([("a", CONTENT, [*ten[:2], *SCORED])]))["results"]  # scored queries are no slots


def trie_nodes(branches: list[tuple[int, ...]]) -> int:
    return len({b[:k] for b in branches for k in range(1, len(b) + 1)})


def test_processed_tokens_count_six_rows_per_slot_token(tiny_engine):
    tk = tiny_engine.tokenizer
    queries = [
        {"id": "a", "template": "\n\nName:{*}", "max_tokens": 7},
        {"id": "b", "template": "\n\nNumber:{n}", "max_tokens": 3},
        {"id": "c", "template": "\n\nName:{*}", "max_tokens": 9, "generate": {"n": 2, "temperature": 1}},
    ]
    body = call_body([("a", CONTENT, queries)])
    used = tiny_engine.score(body)["usage"]["processed_tokens"]
    branches = [tk.tok("\n\nName:"), tk.tok("\n\nNumber:")]  # the two {*} slots share one branch
    assert used == len(tk.bos) + len(tk.tok(CONTENT)) + trie_nodes(branches) + 6 * (7 + 3 + 9)
    longer = call_body([("a", CONTENT, [{**queries[0], "max_tokens": 8}, *queries[1:]])])
    assert tiny_engine.score(longer)["usage"]["processed_tokens"] == used + 6
    assert tiny_engine.score(body | {"limits": {"max_processed_tokens": used}}, trusted=True)["results"]
    error = refused(tiny_engine, body | {"limits": {"max_processed_tokens": used - 1}}, "request_too_large", None,
                    status=413, trusted=True)  # fmt: skip
    assert str(used) in str(error)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": 65}, "scoring.queries.0"),
        ({"max_tokens": 101, "generate": True}, "scoring.queries.0.max_tokens"),
        ({"max_tokens": 101}, "scoring.queries.0.max_tokens"),
        ({"max_tokens": 0}, "scoring.queries.0.max_tokens"),
        ({"generate": True, "top_k": 3}, "scoring.queries.0"),
        ({"generate": True, "calibration": {"a": 1}}, "scoring.queries.0"),
        ({"template": "\n\nCount:{n}", "generate": True}, "scoring.queries.0.generate"),
        ({"template": "\n\nPrice:{$}", "generate": {}}, "scoring.queries.0.generate"),
        ({"options": []}, "scoring.queries.0.options"),
        ({"top_k": 21}, "scoring.queries.0.top_k"),
    ],
)
def test_max_tokens_rules(tiny_engine, extra, param):
    query = {"id": "q", "template": "\n\nName:{*}", **extra}
    body = {"messages": [{"role": "user", "content": "Hi."}], "scoring": {"queries": [query]}}
    refused(tiny_engine, body, "invalid_field", param)


def test_max_tokens_at_the_bounds(tiny_engine):
    """64 searched and 65 generated are allowed (100 generated: the greedy tests of test_decode_exact)."""
    searched = {"id": "s", "template": "\n\nName:{*}", "max_tokens": 64}
    generated = {"id": "g", "template": "\n\nThe name is {*} and", "max_tokens": 65, "generate": {}}
    body = {"messages": [{"role": "user", "content": CONTENT_STOPS}], "scoring": {"queries": [searched, generated]}}
    response = tiny_engine.score(body)
    s, g = response["results"][0]["queries"]
    assert s["kind"] == g["kind"] == "text" and g["generate"] is True and "generate" not in s
    assert g["combinations"][0]["answers"] == [{"text": "", "finish": "stop"}]  # P(end) wins at once here
    assert response["usage"]["generation"]["max_tokens"] == 65


def content_of(tk, count: int) -> str:
    text = "x" + " y" * (count - 1)
    assert len(tk.tok(text)) == count
    return text


@pytest.mark.parametrize(
    ("query", "after"),
    [
        ({"id": "q", "template": "\n\nName:{*}", "max_tokens": 64}, 64),
        pytest.param(
            {"id": "q", "template": "\n\nName:{*}", "max_tokens": 100, "generate": True}, 100, marks=pytest.mark.slow
        ),
        ({"id": "q", "template": "\n\nName:{?}", "options": [" a"]}, 5),  # max_option_tokens
    ],
    ids=["searched", "generated", "scored"],
)
def test_content_too_long_counts_max_tokens(small, query, after):
    tk = small.tokenizer
    template = tk.tok("\n\nName:")
    fits = 128 - len(tk.bos) - len(template) - after  # the engine maximum is 128 tokens
    body = {"messages": [{"role": "user", "content": content_of(tk, fits)}], "scoring": {"queries": [query]}}
    assert small.score(body)["results"]
    over = {**body, "messages": [{"role": "user", "content": content_of(tk, fits + 1)}]}
    error = refused(small, over, "content_too_long", "inputs.0")
    assert "128" in str(error)


def test_the_decode_budget_refuses_a_capture_it_cannot_hold(small):
    """An input's slots keep BOS + content + their template tokens; at most `CAPTURE_TOKENS` of them fit."""
    tk = small.tokenizer
    query = {"id": "q", "template": "\n\nName:{*}", "max_tokens": 4}
    fits = CAPTURE_TOKENS - len(tk.bos) - len(tk.tok("\n\nName:"))
    body = {"messages": [{"role": "user", "content": content_of(tk, fits)}], "scoring": {"queries": [query]}}
    assert small.score(body)["results"][0]["queries"][0]["combinations"][0]["answers"] is not None
    over = {**body, "messages": [{"role": "user", "content": content_of(tk, fits + 1)}]}
    refused(small, over, "request_too_large", None, status=413)
    # scored queries keep nothing
    scored = {**over, "scoring": {"queries": [{"id": "s", "template": "\n\nName:{?}", "options": [" a"]}]}}
    assert small.score(scored)["results"]


def test_the_decoder_budget_refuses_a_slot_that_cannot_fit_alone(chunked):
    fits = {"id": "q", "template": "\n\nName:{*}", "max_tokens": 4}
    body = {"messages": [{"role": "user", "content": CONTENT}], "scoring": {"queries": [fits]}}
    assert chunked.score(body)["results"]
    too_big = {**fits, "max_tokens": 64}  # its 6 rows × 64 steps of keys and values pass the budget
    error = refused(chunked, {**body, "scoring": {"queries": [too_big]}}, "request_too_large", None, status=413)
    assert "decoder budget" in str(error)
    assert chunked.score(body)["results"]  # and the engine serves on


def test_usage_and_timing_of_extraction(tiny_engine):
    queries = [*TARGETS, *SCORED]
    with outcomes(tiny_engine.loop) as found:
        response = tiny_engine.score(call_body([("a", CONTENT, queries)]))
    usage = response["usage"]
    searched = [d for d, _ in found.values() if d.answers is not None]
    generated = [d for d, _ in found.values() if d.sequences is not None]
    assert usage["extraction"] == {
        "slots": 7,
        "text": 5,  # t, g, r and both combinations of w
        "number": 1,
        "currency": 1,
        "answers": sum(len(d.answers) for d in searched),
        "decode_tokens": sum(d.steps for d in searched),
    }
    completion = sum(len(tokens) for d in generated for tokens, _ in d.sequences)
    assert usage["generation"] == {"slots": 2, "sequences": 6, "max_tokens": 6, "generated_tokens": completion}
    assert usage["completion_tokens"] == completion > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + completion
    assert 0 < usage["extraction"]["decode_tokens"] <= 6 + 4 + 3 + 5 + 5
    assert isinstance(response["timing"]["decode_ms"], int) and response["timing"]["decode_ms"] >= 0
    # searched slots only: no generation block, nothing completed
    only_searched = tiny_engine.score(call_body([("a", CONTENT, TARGETS[:3])]))
    assert "generation" not in only_searched["usage"] and only_searched["usage"]["completion_tokens"] == 0
    assert only_searched["usage"]["extraction"]["slots"] == 3 and "decode_ms" in only_searched["timing"]
    # no slot at all: neither block, no decode time
    plain = tiny_engine.score(call_body([("a", CONTENT, SCORED)]))
    assert "extraction" not in plain["usage"] and "generation" not in plain["usage"]
    assert "decode_ms" not in plain["timing"] and plain["usage"]["completion_tokens"] == 0


def test_a_call_whose_slot_cannot_decode_fails_alone(chunked, alone):
    """A shared decode that fails (one call's slot is over the decoder budget) is retried call by call: the other
    calls get their answers, the same as alone, and only the call with the big slot gets the 413."""
    loop = chunked.new_loop(share_passes=True, floor_cache=0)
    big = {"id": "big", "template": "\n\nName:{*}", "max_tokens": 64}
    works = [
        Call(call_body([("a", CONTENT, TARGETS)]), "scr_good"),
        Call(call_body([("b", CONTENT, [big, *SCORED])]), "scr_bad"),
        Call(call_body([("c", OTHER_TEXT, SCORED)]), "scr_plain"),
    ]
    with outcomes(loop) as found:
        loop.run(works)
    assert (targets_of(works[0].unwrap()), raw_of(found, "a", "scr_good")) == alone
    with pytest.raises(ApiError) as info:
        works[1].unwrap()
    assert (info.value.status, info.value.code) == (413, "request_too_large")
    assert works[2].unwrap()["results"][0]["queries"][0]["id"] == "s1"


def test_concurrent_calls_decoded_early_together(small, alone):
    short = [q for q in TARGETS if q["id"] != "w"]
    z = OTHER_TEXT + " " + CONTENT + " Kind regards from the whole team, Bob."
    loop = small.new_loop(share_passes=True, floor_cache=0)
    works = [
        Call(call_body([("z", z, short[:3])]), "scr_z"),
        Call(call_body([("a", CONTENT, short)]), "scr_a"),
        Call(call_body([("y", CONTENT + " " + OTHER_TEXT, short[2:])]), "scr_y"),
    ]
    with outcomes(loop) as found:
        loop.run(works)
    assert loop.statistics().passes >= 2
    assert targets_of(works[1].unwrap()) == {k: v for k, v in alone[0].items() if k != "w"}
    assert raw_of(found, "a") == {key: v for key, v in alone[1].items() if key[0] != "w"}


def test_an_empty_extraction_template_branches_at_the_content_end_without_a_cut(tiny_engine):
    """A.5 item 2 cuts the content for an extraction slot with no template text before it, so that the slot has
    tokens to branch on. This engine branches at the content's last token instead (`PREFIX_END`): the tokens are the
    same (a valid cut never changes them), so the answers are the same, and no other question of the input is moved
    off the content part of its attention, which keeps their bits whatever slots share the input (engine spec C.1).
    Without a join to check there is no ``join_not_merged``, even where no valid cut exists."""
    text = "日本語" * 120  # no valid cut: every late token boundary splits a character
    empty = {"id": "g", "template": "{*}", "generate": True, "max_tokens": 2}
    response = tiny_engine.score({"messages": [{"role": "user", "content": text}], "scoring": {"queries": [empty]}})
    assert response["warnings"] == []
    content = "Please refund the second payment of my order, it was charged twice."
    scored = {"id": "s", "template": "\n\nIs it a refund?{?}", "options": [" yes", " no"]}

    def scored_of(queries):
        answer = tiny_engine.score(
            {"messages": [{"role": "user", "content": content}], "scoring": {"queries": queries}}
        )
        return [q for q in answer["results"][0]["queries"] if q["id"] == "s"]

    assert scored_of([scored]) == scored_of([scored, {**empty, "max_tokens": 4}])
