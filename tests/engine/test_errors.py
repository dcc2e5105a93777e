"""Refusals through `Engine.score`: the codes of api spec §4.1–§4.9, status, code and param exactly (§2.5).

Query-level checks run twice, on a shared query (``scoring.queries.0``) and on a per-input one
(``inputs.0.queries.0``). Limits are made small on extra engines (cheap: the tiny model is cached per session).
"""

from __future__ import annotations

import functools

import pytest
from transformers import AutoTokenizer

from spinf.errors import ApiError
from spinf.settings import Limits

DROP = object()
TEXT = "The movie was great."  # 7 tokens; ends cleanly before templates that start with "\n" or "Answer"
YES_NO = [" yes", " no"]
SCORED = {"id": "q", "template": "Answer:{?}", "options": YES_NO}
WHERE = {"shared": "scoring.queries.0", "own": "inputs.0.queries.0"}


def query(**changes) -> dict:
    out = {**SCORED, **changes}
    return {key: value for key, value in out.items() if value is not DROP}


def inp(id_: str = "a", text: str = TEXT, **extra) -> dict:
    return {"id": id_, "messages": [{"role": "user", "content": text}], **extra}


def body(*queries: dict, inputs: list | None = None, **top) -> dict:
    return {"inputs": [inp()] if inputs is None else inputs, "scoring": {"queries": list(queries)}, **top}


def placed(q: dict, where: str) -> dict:
    """A one-input body with ``q`` as its shared query or as the input's own query."""
    return body(q) if where == "shared" else body(inputs=[inp(queries=[q])])


def refused(engine, request: dict, code: str, param: str | None, status: int = 400) -> ApiError:
    with pytest.raises(ApiError) as info:
        engine.score(request)
    error = info.value
    assert (error.status, error.code, error.param) == (status, code, param), error.message
    return error


@pytest.fixture(scope="module")
def engine_with(tiny_cache):
    """``engine_with(token_budget=…, max_tokens=…, **limits)``: an engine with those settings, built once."""
    from spinf import Engine

    @functools.cache
    def build(token_budget: int = 16_384, max_tokens: int = 65_536, **limits) -> Engine:
        return Engine(
            "spinf/tiny-gemma4",
            device="cpu",
            cache_dir=tiny_cache,
            limits=Limits(**limits),
            token_budget=token_budget,
            max_tokens=max_tokens,
        )

    return build


@pytest.fixture(scope="module")
def ntok(tiny_engine):
    tokenizer = AutoTokenizer.from_pretrained(tiny_engine.folder)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(params=sorted(WHERE))
def where(request) -> str:
    return request.param


# §4.6–§4.8: one query's checks, on a shared and on a per-input query.


@pytest.mark.parametrize(
    "template",
    [
        "Answer:",  # no slot
        "{?} Answer:",  # {?} not last
        "Is it {bad-name}?{?}",
        "Answer}:{?}",  # stray }
        "Answer{:{?}",  # unclosed {
        "{a}{b}{c}{d}{e}{f}{?}",  # 6 placeholders
        'It says "{*}" and {?}',  # an extraction slot and {?}
        "{n} Answer:{?}",  # {n} in a {?} template
        "A{?}B{?}",
    ],
)
def test_invalid_template(tiny_engine, where, template):
    refused(tiny_engine, placed(query(template=template), where), "invalid_template", f"{WHERE[where]}.template")


@pytest.mark.parametrize(
    ("changes", "suffix"),
    [
        ({"template": "Is it {x}?{?}"}, ".combinations"),
        ({"template": "Is it {x}?{?}", "combinations": []}, ".combinations"),
        ({"template": "{x} {y}?{?}", "combinations": [{"x": "a", "y": "b"}, {"x": "a"}]}, ".combinations.1"),
        ({"template": "Is it {x}?{?}", "combinations": "all"}, ".values"),
        ({"template": "Is it {x}?{?}", "combinations": "all", "values": None}, ".values"),
        ({"template": "{x} {y}?{?}", "combinations": "all", "values": {"x": ["a"]}}, ".values"),
        ({"template": "{x} {y}?{?}", "combinations": "all", "values": {"x": ["a"], "y": []}}, ".values.y"),
        ({"options": DROP}, ".options"),
    ],
)
def test_missing_value(tiny_engine, where, changes, suffix):
    refused(tiny_engine, placed(query(**changes), where), "missing_value", WHERE[where] + suffix)


@pytest.mark.parametrize(
    ("changes", "suffix"),
    [
        ({"template": "Is it {x}?{?}", "combinations": [{"x": "a"}, {"x": "b", "z": "c"}]}, ".combinations.1"),
        ({"combinations": [{"x": "a"}]}, ".combinations.0"),  # the template has no placeholder
        ({"template": "Is it {x}?{?}", "combinations": "all", "values": {"x": ["a"], "z": ["b"]}}, ".values"),
    ],
)
def test_unknown_placeholder(tiny_engine, where, changes, suffix):
    refused(tiny_engine, placed(query(**changes), where), "unknown_placeholder", WHERE[where] + suffix)


def test_too_many_combinations(engine_with, where):
    grid = {"template": "{x} {y}:{?}", "combinations": "all"}
    over = query(**grid, values={"x": [f"x{i}" for i in range(10)], "y": [f"y{i}" for i in range(101)]})
    refused(engine_with(), placed(over, where), "too_many_combinations", WHERE[where])
    # Exactly 1,000 passes the combination check and reaches the processed-token limit instead.
    ok = query(**grid, values={"x": [f"x{i}" for i in range(10)], "y": [f"y{i}" for i in range(100)]})
    refused(engine_with(max_processed_tokens=1), placed(ok, where), "request_too_large", None, status=413)


def test_too_many_options(engine_with, where):
    refused(engine_with(), placed(query(options=[]), where), "too_many_options", f"{WHERE[where]}.options")
    small = engine_with(max_options=2)
    refused(
        small, placed(query(options=[" yes", " no", " good"]), where), "too_many_options", f"{WHERE[where]}.options"
    )
    small.score(placed(query(options=[" yes", " no"]), where))


@pytest.mark.parametrize(
    ("options", "case_insensitive", "index"),
    [
        ([" yes", "Yes"], True, 1),  # the spec's example: equal after trimming and casefolding
        ([" yes", " no", "NO "], True, 2),
        ([" yes", " no", " yes"], False, 2),
        ([" yes", "Yes"], False, None),  # case-sensitive: only identical strings clash
        ([" yes", " Yes", " YES"], False, None),
    ],
)
def test_duplicate_option(tiny_engine, where, options, case_insensitive, index):
    request = placed(query(options=options), where)
    request["scoring"]["case_insensitive"] = case_insensitive
    if index is None:
        tiny_engine.score(request)
    else:
        refused(tiny_engine, request, "duplicate_option", f"{WHERE[where]}.options.{index}")


def test_option_too_long(engine_with, ntok, where):
    long_option = " the quick brown fox jumps over the lazy dog"
    assert ntok(long_option) > 5
    refused(
        engine_with(),
        placed(query(options=[" yes", long_option]), where),
        "option_too_long",
        f"{WHERE[where]}.options.1",
    )
    small = engine_with(max_option_tokens=2)
    assert (ntok(" maybe"), ntok(" definitely not")) == (2, 4)
    small.score(placed(query(options=[" yes", " maybe"]), where))
    bad = query(options=[" yes", " maybe", " definitely not"])
    refused(small, placed(bad, where), "option_too_long", f"{WHERE[where]}.options.2")


def test_option_boundary(tiny_engine, ntok, where):
    # The spec's example fails here too: tok("Answer: ") ends with a lone " " token, while "Answer: yes" ends with
    # the single token " yes", so the joined text does not split as tok("Answer: ") + tok("yes").
    assert (ntok("Answer: "), ntok("yes"), ntok("Answer: yes")) == (3, 1, 3)
    refused(
        tiny_engine,
        placed(query(template="Answer: {?}", options=["yes", "no"]), where),
        "option_boundary",
        f"{WHERE[where]}.options.0",
    )
    # "Answer ke" + "no" does not split as tok("Answer ke") + tok("no"): only the second ending fails.
    two = query(template="{x}{?}", combinations=[{"x": "Answer:"}, {"x": "Answer ke"}], options=[" yes", "no"])
    refused(tiny_engine, placed(two, where), "option_boundary", f"{WHERE[where]}.options.1")


def test_option_boundary_reads_the_first_16_endings(tiny_engine):
    clean = [{"x": f"Answer {letter}:"} for letter in "ABCDEFGHIJKLMNOP"]
    late = query(template="{x}{?}", combinations=[*clean, {"x": "Answer ke"}], options=[" yes", "no"])
    tiny_engine.score(body(late))  # the 17th distinct ending is not checked
    early = query(template="{x}{?}", combinations=[*clean[:15], {"x": "Answer ke"}], options=[" yes", "no"])
    refused(tiny_engine, body(early), "option_boundary", "scoring.queries.0.options.1")


def test_template_too_long(engine_with, ntok, where):
    assert (ntok("\nQuestion:"), ntok("\nQuestion: Is it good? Answer:")) == (5, 13)
    small = engine_with(max_query_tokens=5)
    combos = [{"x": "\nQuestion:"}, {"x": "\nQuestion:"}, {"x": "\nQuestion: Is it good? Answer:"}]
    refused(
        small,
        placed(query(template="{x}{?}", combinations=combos), where),
        "template_too_long",
        f"{WHERE[where]}.combinations.2",
    )
    small.score(placed(query(template="{x}{?}", combinations=combos[:2]), where))


def test_invalid_field_for_long_value_and_empty_option(tiny_engine, where):
    prefix = WHERE[where]
    listed = query(template="Is it {x}?{?}", combinations=[{"x": "a"}, {"x": "b" * 257}])
    refused(tiny_engine, placed(listed, where), "invalid_field", f"{prefix}.combinations.1.x")
    # "all": j is the index of the first combination holding the value ("x" varies slowest).
    grid = query(template="{x} {y}?{?}", combinations="all", values={"x": ["a", "b"], "y": ["c", "d" * 257]})
    refused(tiny_engine, placed(grid, where), "invalid_field", f"{prefix}.combinations.1.y")
    tiny_engine.score(placed(query(template="Is it{x}?{?}", combinations=[{"x": " a" * 128}]), where))
    refused(tiny_engine, placed(query(options=[" yes", ""]), where), "invalid_field", f"{prefix}.options.1")


@pytest.fixture(scope="module")
def no_extraction_engine(tiny_cache):
    from spinf import Engine
    from spinf.settings import Features

    return Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, features=Features(extraction=False))


@pytest.mark.parametrize("template", ['It says "{*}"', "Count:{n}", "Price:{$}"])
def test_extraction_disabled(tiny_engine, no_extraction_engine, where, template):
    q = query(template=template, options=DROP)
    refused(no_extraction_engine, placed(q, where), "extraction_disabled", f"{WHERE[where]}.template")
    answer = tiny_engine.score(placed(q, where))  # served where extraction is on
    assert answer["results"][0]["queries"][0]["kind"] in ("text", "number", "currency")


# §4.2 and §4.9: ids and the choice of queries.


def test_duplicate_ids(tiny_engine):
    refused(tiny_engine, body(query(), inputs=[inp("a"), inp("b"), inp("a")]), "duplicate_id", "inputs.2.id")
    shared = body(query(), query(id="r"), query())
    refused(tiny_engine, shared, "duplicate_id", "scoring.queries.2.id")
    own = body(query(), inputs=[inp("a"), inp("b", queries=[query(id="p"), query(id="p")])])
    refused(tiny_engine, own, "duplicate_id", "inputs.1.queries.1.id")
    same_as_chosen = body(query(), inputs=[inp(queries=[query(id="p"), query(id="q")])])
    refused(tiny_engine, same_as_chosen, "duplicate_id", "inputs.0.queries.1.id")
    listed = body(query(), query(id="r"), inputs=[inp(query_ids=["r", "q"], queries=[query(id="q")])])
    refused(tiny_engine, listed, "duplicate_id", "inputs.0.queries.0.id")


def test_own_query_may_reuse_an_unchosen_shared_id(tiny_engine):
    request = body(query(), query(id="r"), inputs=[inp("a", query_ids=["r"], queries=[query(template="\nSo:{?}")])])
    request["inputs"].append(inp("b", queries=[query(id="p")]))  # per-input ids are per input
    request["inputs"].append(inp("c", queries=[query(id="p")]))
    results = tiny_engine.score(request)["results"]
    assert [[q["id"] for q in r["queries"]] for r in results] == [["r", "q"], ["q", "r", "p"], ["q", "r", "p"]]


def test_unknown_query_id(tiny_engine):
    request = body(query(), inputs=[inp("a", query_ids=["q"]), inp("b", query_ids=["q", "zzz"])])
    refused(tiny_engine, request, "unknown_query_id", "inputs.1.query_ids.1")


def test_empty_queries(tiny_engine):
    refused(tiny_engine, body(query(), inputs=[inp("a"), inp("b", query_ids=[])]), "empty_queries", "inputs.1")
    refused(tiny_engine, {"inputs": [inp()]}, "empty_queries", "inputs.0")
    refused(tiny_engine, body(inputs=[inp(query_ids=[], queries=[])]), "empty_queries", "inputs.0")


def test_too_many_prompts(engine_with):
    small = engine_with(max_prompts_per_input=3)
    two = query(template="{x}:{?}", combinations=[{"x": "Answer"}, {"x": "Reply"}])
    ok = inp("a", query_ids=["q"], queries=[query(id="r")])  # 2 + 1 prompts
    over = inp("b", queries=[query(id="r", template="{x}:{?}", combinations=[{"x": "So"}, {"x": "Then"}])])  # 2 + 2
    small.score(body(two, inputs=[ok]))
    refused(small, body(two, inputs=[ok, over]), "too_many_prompts", "inputs.1")


def test_content_too_long(engine_with, ntok):
    assert ntok(TEXT) == 7
    small = engine_with(max_content_tokens=7)
    small.score(body(query(), inputs=[inp("a"), inp("b", TEXT)]))
    refused(small, body(query(), inputs=[inp("a"), inp("b", TEXT + " Yes.")]), "content_too_long", "inputs.1")
    two_messages = {"id": "a", "messages": [{"content": "The movie"}, {"content": "was great."}]}  # joined by "\n\n"
    refused(small, body(query(), inputs=[two_messages]), "content_too_long", "inputs.0")
    refused(
        small,
        {"messages": [{"content": TEXT + " Yes."}], "scoring": {"queries": [query()]}},
        "content_too_long",
        "inputs.0",
    )


def test_content_too_long_for_the_engine_maximum(engine_with, ntok):
    # Engine maximum = max(128, 256) = 256 >= BOS + content + longest filled template + max_option_tokens (5).
    engine = engine_with(token_budget=128, max_tokens=256, max_content_tokens=100_000)
    q = query(template="{x}:{?}", combinations=[{"x": "\nA"}, {"x": "\nAnswer"}])
    assert (ntok("\nA:"), ntok("\nAnswer:")) == (3, 3)
    engine.score(body(q, inputs=[inp(text=" a" * 247)]))  # 1 + 247 + 3 + 5 = 256
    refused(engine, body(q, inputs=[inp(text=" a" * 248)]), "content_too_long", "inputs.0")
    longer = query(template="{x}:{?}", combinations=[{"x": "\nA"}, {"x": "\nThe answer"}])
    assert ntok("\nThe answer:") == 5
    refused(engine, body(longer, inputs=[inp(text=" a" * 247)]), "content_too_long", "inputs.0")


def test_request_too_large(engine_with):
    request = body(query(), inputs=[inp("a"), inp("b", "Dull.")])
    needed = engine_with().score(request)["usage"]["processed_tokens"]
    engine_with(max_processed_tokens=needed).score(request)
    refused(engine_with(max_processed_tokens=needed - 1), request, "request_too_large", None, status=413)


# §4.1 and §4.3: the body, the model, content parts.


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ([], "body"),
        ({"messages": [{"content": TEXT}], "inputs": [inp()], "scoring": {"queries": [SCORED]}}, "messages"),
        ({"scoring": {"queries": [SCORED]}}, "messages"),
        (body(SCORED, inputs=[]), "inputs"),
        (body(SCORED, model=""), "model"),
        (body(SCORED, endpoint="x" * 129), "endpoint"),
        ({"inputs": [inp()], "scoring": [SCORED]}, "scoring"),
        ({"inputs": [inp()], "scoring": {"queries": {"q": SCORED}}}, "scoring.queries"),
        (body(SCORED, inputs=[inp(), {"id": 5, "messages": []}]), "inputs.1.id"),
        (body(SCORED, inputs=[{"id": "a"}]), "inputs.0.messages"),
        (body(query(generate=False)), "scoring.queries.0"),
    ],
)
def test_invalid_field(tiny_engine, request_body, param):
    refused(tiny_engine, request_body, "invalid_field", param)


def test_untrusted_limits_are_ignored(tiny_engine):
    tiny_engine.score(body(query(), limits={"max_content_tokens": 1}))


def test_model_not_served(tiny_engine):
    refused(tiny_engine, body(query(), model="spinf-12b"), "model_not_served", "model")
    for name in ("spinf/TINY-gemma4", "Tiny"):
        assert tiny_engine.score(body(query(), model=name))["model"] == name


def test_media_not_supported(tmp_path):
    from spinf import Engine
    from spinf.engine.gemma4.tiny_tower import write_tiny_tower

    tower = Engine(str(write_tiny_tower(tmp_path / "tower")), device="cpu")  # the 31B's layout reads no audio
    sound = {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}
    parts = {"id": "b", "messages": [{"content": [{"type": "text", "text": "Hear:"}, sound]}]}
    refused(tower, body(query(), inputs=[inp(), parts]), "media_not_supported", "inputs.1.messages")
    message_form = {"messages": parts["messages"], "scoring": {"queries": [query()]}}
    refused(tower, message_form, "media_not_supported", "inputs.0.messages")


def test_media_disabled_and_bad_media(tiny_engine, tiny_cache):
    from spinf import Engine
    from spinf.settings import Features

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    parts = {"id": "b", "messages": [{"content": [{"type": "text", "text": "See:"}, image]}]}
    no_images = Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, features=Features(media={"audio"}))
    assert no_images.embedders.vision is None and no_images.embedders.audio is not None  # only what is on
    refused(no_images, body(query(), inputs=[inp(), parts]), "media_disabled", "inputs.1.messages")
    refused(tiny_engine, body(query(), inputs=[inp(), parts]), "invalid_media", "inputs.1.messages.0.content.1")


@pytest.mark.parametrize("part", [{"type": "file", "file": {"data": "AA=="}}, {"type": "text"}])
def test_unsupported_content(tiny_engine, part):
    messages = [{"content": "Intro."}, {"content": [{"type": "text", "text": "See:"}, part]}]
    request = body(query(), inputs=[inp(), {"id": "b", "messages": messages}])
    refused(tiny_engine, request, "unsupported_content", "inputs.1.messages.1.content.1")


def test_unknown_pack(tiny_engine):
    request = body(query())
    request["scoring"]["packs"] = [{"id": "spinf/none"}]
    refused(tiny_engine, request, "unknown_pack", "scoring.packs.0.id")


# §4.9: the order of the checks, per input.


def test_content_too_long_comes_before_the_chosen_queries(engine_with):
    small = engine_with(max_content_tokens=3)
    bad_shared = query(options=[])
    bad_own = query(id="own", template="Answer: {?}", options=["yes"])
    request = body(bad_shared, inputs=[inp("a", queries=[bad_own]), inp("b", "Hi.")])
    refused(small, request, "content_too_long", "inputs.0")


def test_inputs_are_checked_one_after_the_other(engine_with):
    small = engine_with(max_content_tokens=7)
    dup = query(id="own", options=[" yes", "YES"])
    # Input 0 passes every check, so input 1's own query is reported.
    refused(
        small,
        body(query(), inputs=[inp("a"), inp("b", "Hi.", queries=[dup])]),
        "duplicate_option",
        "inputs.1.queries.0.options.1",
    )
    # Input 0's query error comes before input 1's content.
    request = body(query(), inputs=[inp("a", queries=[dup]), inp("b", TEXT + " Yes.")])
    refused(small, request, "duplicate_option", "inputs.0.queries.0.options.1")
    # Template errors are raised while parsing, before any engine check (§4.6, §4.12).
    request = body(query(), inputs=[inp("a", TEXT + " Yes."), inp("b", queries=[query(id="t", template="A:")])])
    refused(small, request, "invalid_template", "inputs.1.queries.0.template")


def test_shared_query_errors_use_the_shared_path(tiny_engine):
    bad = query(id="bad", options=[" yes", " Yes"])
    request = body(query(), bad, inputs=[inp("a", query_ids=["q"]), inp("b")])
    refused(tiny_engine, request, "duplicate_option", "scoring.queries.1.options.1")
    # A shared query chosen by no input is never checked (§4.9 step 4 checks the chosen queries).
    tiny_engine.score(body(query(), bad, inputs=[inp("a", query_ids=["q"]), inp("b", query_ids=["q"])]))


def test_a_query_is_checked_in_spec_order(engine_with):
    engine = engine_with(max_query_tokens=2)
    # §4.7 (combinations) before §4.8 (tokens and options), template length before the options.
    request = body(query(template="Is it {x}?{?}", options=[]))
    refused(engine, request, "missing_value", "scoring.queries.0.combinations")
    refused(
        engine, body(query(template="Is it?{?}", options=[])), "template_too_long", "scoring.queries.0.combinations.0"
    )
    # Duplicates before token counts: option 1 is too long, but the clash of option 2 is reported.
    options = [" yes", " the quick brown fox jumps over the lazy dog", " YES"]
    refused(engine, body(query(options=options)), "duplicate_option", "scoring.queries.0.options.2")
