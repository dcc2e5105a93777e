"""Decoding and validating score bodies (api spec §2.1, §4.1–§4.5, §4.10–§4.12): typed results and every refusal."""

from __future__ import annotations

import pytest

from spinf.errors import ApiError
from spinf.protocol.request import decode_json_body, parse_score_request
from spinf.protocol.types import Generate, Slot
from tests.protocol.bodies import ALL_MEDIA, DROP, SCORED, TEXT, body, content, merged, shared

# Decoding (§2.1)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_decode_detects_the_encoding(encoding):
    assert decode_json_body('{"a": ["é", 1.5]}'.encode(encoding)) == {"a": ["é", 1.5]}


def test_decode_keeps_escaped_surrogate_pairs():
    assert decode_json_body(b'"\\ud83d\\ude00"') == "\U0001f600"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", r"^the request body is empty$"),
        (b"   ", r"^the request body is not valid JSON: Expecting value.*$"),
        (b'{"a": 1', r"^the request body is not valid JSON: .*$"),
        (b"\xff\xfe\xfa", r"^the request body is not valid JSON: .*$"),
        (b"NaN", r"^the request body is not valid JSON: NaN is not a JSON number$"),
        (b"[-Infinity]", r"^the request body is not valid JSON: -Infinity is not a JSON number$"),
        (b"[1e999]", r"^the request body is not valid JSON: the number 1e999 is out of range$"),
        (b'{"a": "\\ud800"}', r"^the request body is not valid JSON: .*surrogates not allowed$"),
        (b'"\xed\xa0\x80"', r"^the request body is not valid JSON: .*$"),
        (b"[" * 100_000, r"^the request body is not valid JSON: it is nested too deeply$"),
    ],
)
def test_decode_refused(raw, message):
    with pytest.raises(ApiError, match=message) as info:
        decode_json_body(raw)
    assert (info.value.status, info.value.code, info.value.param) == (400, "invalid_json", None)


# A valid request, typed


def test_a_full_request_is_typed():
    query = {
        "id": "g",
        "template": "Summary of {topic}: {*}",
        "combinations": [{"topic": "sales"}],
        "group": "mine",
        "max_tokens": 100,
        "generate": {"temperature": 0.5, "n": 3},
    }
    searched = {"id": "n", "template": "{n}", "top_k": 3, "calibration": {"b": 2}, "max_tokens": 64}
    req = parse_score_request(
        body(
            scoring={"empty_floor": False, "case_insensitive": False},
            input={"query_ids": ["q"], "queries": [query, searched], "parameters": {"p": 1.5}},
            model="Spinf-12B",
            endpoint="triage",
        ),
        served_names=["spinf-12b", "gemma-4-12b"],
    )
    assert (req.model, req.endpoint, req.empty_floor, req.case_insensitive, req.messages_form) == (
        "Spinf-12B",
        "triage",
        False,
        False,
        False,
    )
    [sq] = req.queries
    assert (sq.path, sq.id, sq.options, sq.combinations, sq.template.slot) == (
        "scoring.queries.0",
        "q",
        (" yes", " no"),
        None,
        Slot.SCORE,
    )
    [inp] = req.inputs
    assert (inp.path, inp.id, inp.segments, inp.query_ids, inp.parameters) == (
        "inputs.0",
        "a",
        ("hello",),
        ("q",),
        {"p": 1.5},
    )
    gen, num = inp.queries
    assert (gen.path, gen.combinations, gen.group, gen.max_tokens) == (
        "inputs.0.queries.0",
        ({"topic": "sales"},),
        "mine",
        100,
    )
    assert gen.generate == Generate(temperature=0.5, top_p=1.0, top_k=40, seed=0, n=3)
    assert (num.top_k, num.calibration, num.generate, num.template.slot) == (3, (1.0, 2.0), None, Slot.NUMBER)


@pytest.mark.parametrize(
    ("generate", "expected"),
    [
        (None, None),
        (False, None),
        (True, Generate()),
        ({}, Generate()),
        ({"top_k": 7, "seed": 9}, Generate(top_k=7, seed=9)),
    ],
)
def test_generate_forms(generate, expected):
    assert parse_score_request(shared(merged(TEXT, {"generate": generate}))).queries[0].generate == expected


def test_all_with_values_is_kept_as_sent():
    query = {"template": "{a}{?}", "combinations": "all", "values": {"a": ["1", "2"]}}
    [q] = parse_score_request(body(query=query)).queries
    assert (q.combinations, q.values) == ("all", {"a": ("1", "2")})


@pytest.mark.parametrize("packs", [[], DROP])
def test_no_packs_is_accepted(packs):
    parse_score_request(body(scoring={"packs": packs}))


def test_the_chat_route_takes_the_same_body():
    assert parse_score_request(body(), chat=True).queries[0].id == "q"


def test_unknown_keys_are_ignored_everywhere():
    req = parse_score_request(
        body(
            query={"note": 1},
            input={
                "content": "x",
                "extra": None,
                "messages": [{"content": [{"type": "text", "text": "t", "x": 1}], "name": 2}],
            },
            scoring={"foo": "bar"},
            debug=True,
            packs=["not", "read"],
        )
    )
    assert req.inputs[0].segments == ("t",)


# Every refusal of parse_score_request, by step of §4.12


def refusals():
    long = "x" * 129
    yield "body", [], "invalid_field", "body"
    yield "body-string", "x", "invalid_field", "body"
    yield "neither", {"scoring": {}}, "invalid_field", "messages"
    yield "both", body(messages=[]), "invalid_field", "messages"
    yield "both-null", body(inputs=None, messages=None), "invalid_field", "messages"
    yield "model-null", body(model=None), "invalid_field", "model"
    yield "model-empty", body(model=""), "invalid_field", "model"
    yield "model-number", body(model=12), "invalid_field", "model"
    yield "model-unknown", body(model="spinf-31b"), "model_not_served", "model"
    yield "endpoint-empty", body(endpoint=""), "invalid_field", "endpoint"
    yield "endpoint-long", body(endpoint=long), "invalid_field", "endpoint"
    yield "endpoint-null", body(endpoint=None), "invalid_field", "endpoint"
    yield "scoring-type", body() | {"scoring": []}, "invalid_field", "scoring"
    yield "scoring-null", body() | {"scoring": None}, "invalid_field", "scoring"
    yield "queries-type", body(scoring={"queries": {}}), "invalid_field", "scoring.queries"
    yield "inputs-empty", body(inputs=[]), "invalid_field", "inputs"
    yield "inputs-type", body(inputs={"id": "a"}), "invalid_field", "inputs"
    yield from pack_refusals()
    yield from schema_refusals()
    yield from slot_refusals()
    yield "dup-shared", body(scoring={"queries": [SCORED, TEXT, SCORED]}), "duplicate_id", "scoring.queries.2.id"
    yield "dup-input", body(inputs=[{"id": "a", "messages": []}] * 2), "duplicate_id", "inputs.1.id"
    yield (
        "unknown-part",
        body(input=content({"type": "file", "file": {}})),
        "unsupported_content",
        "inputs.0.messages.0.content.0",
    )
    yield (
        "text-no-payload",
        body(input=content({"type": "text"})),
        "unsupported_content",
        "inputs.0.messages.0.content.0",
    )
    yield (
        "text-null",
        body(input=content({"type": "text", "text": None})),
        "unsupported_content",
        "inputs.0.messages.0.content.0",
    )
    yield (
        "image-no-payload",
        body(input=content({"type": "text", "text": "a"}, {"type": "image_url"})),
        "unsupported_content",
        "inputs.0.messages.0.content.1",
    )
    yield (
        "video-not-object",
        body(input=content({"type": "video", "video": "clip"})),
        "invalid_media",
        "inputs.0.messages.0.content.0",
    )


def pack_refusals():
    p = "scoring.packs"
    yield "packs-type", body(scoring={"packs": {"id": "x"}}), "invalid_field", p
    yield "packs-null", body(scoring={"packs": None}), "invalid_field", p
    yield "pack-type", body(scoring={"packs": ["x"]}), "invalid_field", f"{p}.0"
    yield (
        "pack-key",
        body(scoring={"packs": [{"id": "a"}, {"id": "b", "mode": "max"}]}),
        "invalid_field",
        f"{p}.1.mode",
    )
    yield "pack-no-id", body(scoring={"packs": [{"version": "1"}]}), "invalid_field", f"{p}.0.id"
    yield "pack-empty-id", body(scoring={"packs": [{"id": ""}]}), "invalid_field", f"{p}.0.id"
    yield "pack-dup", body(scoring={"packs": [{"id": "a"}, {"id": "b"}, {"id": "a"}]}), "duplicate_id", f"{p}.2.id"
    yield (
        "pack-unknown",
        body(scoring={"packs": [{"id": "moderation/v1", "include_queries": True}]}),
        "unknown_pack",
        f"{p}.0.id",
    )


def schema_refusals():
    q, i, m = "scoring.queries.0", "inputs.0", "inputs.0.messages.0"
    for field, value, param in [
        ("empty_floor", None, "scoring.empty_floor"),
        ("case_insensitive", 1, "scoring.case_insensitive"),
        ("queries", [SCORED, 3], "scoring.queries.1"),
    ]:
        yield f"scoring.{field}", body(scoring={field: value}), "invalid_field", param
    for field, value, param in [
        ("id", DROP, "id"),
        ("id", 5, "id"),
        ("id", "x" * 129, "id"),
        ("template", DROP, "template"),
        ("template", None, "template"),
        ("options", "yes", "options"),
        ("options", None, "options"),
        ("options", [" yes", 1], "options.1"),
        ("combinations", "some", "combinations"),
        ("combinations", {"a": "1"}, "combinations"),
        ("combinations", [{"a": "1"}, "b"], "combinations.1"),
        ("combinations", [{"a": 1}], "combinations.0.a"),
        ("values", [], "values"),
        ("values", {"a": "1"}, "values.a"),
        ("values", {"a": ["1", None]}, "values.a.1"),
        ("empty_floor", "no", "empty_floor"),
        ("group", 7, "group"),
        ("group", "g" * 129, "group"),
        ("max_tokens", 0, "max_tokens"),
        ("max_tokens", 101, "max_tokens"),
        ("max_tokens", True, "max_tokens"),
        ("max_tokens", 16.0, "max_tokens"),
        ("max_tokens", None, "max_tokens"),
        ("top_k", 0, "top_k"),
        ("top_k", 21, "top_k"),
        ("calibration", [1, 0], "calibration"),
        ("calibration", {"a": "1"}, "calibration.a"),
        ("calibration", {"b": True}, "calibration.b"),
        ("generate", "yes", "generate"),
        ("generate", 1, "generate"),
        ("generate", {"temperature": 2.5}, "generate.temperature"),
        ("generate", {"temperature": False}, "generate.temperature"),
        ("generate", {"top_p": 0}, "generate.top_p"),
        ("generate", {"top_p": 1.01}, "generate.top_p"),
        ("generate", {"top_k": 101}, "generate.top_k"),
        ("generate", {"seed": -1}, "generate.seed"),
        ("generate", {"seed": 2**31}, "generate.seed"),
        ("generate", {"n": 7}, "generate.n"),
        ("generate", {"n": 0}, "generate.n"),
    ]:
        yield f"query.{field}={value!r:.20}", body(query={field: value}), "invalid_field", f"{q}.{param}"
    for fields, param in [
        ({"id": 1}, "id"),
        ({"id": DROP}, "id"),
        ({"id": "i" * 129}, "id"),
        ({"messages": DROP}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": ["hello"]}, "messages.0"),
        ({"messages": [{"role": 1, "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        ({"messages": [{"content": None}]}, "messages.0.content"),
        ({"messages": [{"content": {"type": "text"}}]}, "messages.0.content"),
        ({"messages": [{"content": ["x"]}]}, "messages.0.content.0"),
        ({"messages": [{"content": [{"text": "x"}]}]}, "messages.0.content.0.type"),
        ({"messages": [{"content": [{"type": None}]}]}, "messages.0.content.0.type"),
        ({"messages": [{"content": [{"type": "text", "text": 5}]}]}, "messages.0.content.0.text"),
        ({"query_ids": "q"}, "query_ids"),
        ({"query_ids": ["q", 2]}, "query_ids.1"),
        ({"queries": None}, "queries"),
        ({"queries": [{"id": "x"}]}, "queries.0.template"),
        ({"parameters": ["a"]}, "parameters"),
        ({"parameters": {"p": None}}, "parameters.p"),
        ({"parameters": {"p": [1]}}, "parameters.p"),
    ]:
        yield f"input.{list(fields)[0]}={fields!r:.30}", body(input=fields), "invalid_field", f"{i}.{param}"
    yield "messages-form-type", body(inputs=DROP, messages="hi"), "invalid_field", "inputs.0.messages"
    yield "messages-form-part", body(inputs=DROP, messages=[{"content": [1]}]), "invalid_field", f"{m}.content.0"


def slot_refusals():
    q = "scoring.queries.0"
    yield "template-grammar", body(query={"template": "{?} after"}), "invalid_template", f"{q}.template"
    yield (
        "own-template",
        body(input={"queries": [{"id": "o", "template": "}"}]}),
        "invalid_template",
        "inputs.0.queries.0.template",
    )
    for field, value in [("max_tokens", 16), ("top_k", 5), ("calibration", {}), ("generate", False), ("generate", {})]:
        yield f"scored-{field}-{value}", body(query={field: value}), "invalid_field", q
    yield "extraction-options", shared(merged(TEXT, {"options": []})), "invalid_field", f"{q}.options"
    yield (
        "number-generate",
        body(query={"template": "{n}", "options": DROP, "generate": False}),
        "invalid_field",
        f"{q}.generate",
    )
    yield (
        "currency-generate",
        body(query={"template": "{$}", "options": DROP, "generate": True}),
        "invalid_field",
        f"{q}.generate",
    )
    for field, value in [("top_k", 3), ("calibration", {"a": 2})]:
        yield f"generate-{field}", shared(merged(TEXT, {"generate": True, field: value})), "invalid_field", q
    yield "max-tokens-65", shared(merged(TEXT, {"max_tokens": 65})), "invalid_field", q
    yield "max-tokens-65-no-generate", shared(merged(TEXT, {"max_tokens": 65, "generate": False})), "invalid_field", q


@pytest.mark.parametrize(("data", "code", "param"), [pytest.param(*case[1:], id=case[0]) for case in refusals()])
def test_refused(refused, data, code, param):
    refused(lambda: parse_score_request(data, served_names=["spinf-12b"], model_media=ALL_MEDIA), code, param)


def test_model_not_served_names_each_name_once():
    """The served name is often the manifest id as well, and names compare without case: each is listed once."""
    names = ["spinf/tiny-gemma4", "spinf/tiny-gemma4", "tiny", "TINY", "Spinf/Tiny-Gemma4"]
    with pytest.raises(ApiError) as refused:
        parse_score_request(body(model="gpt-4"), served_names=names)
    assert refused.value.message == "model 'gpt-4' is not served here; its names are 'spinf/tiny-gemma4', 'tiny'"
