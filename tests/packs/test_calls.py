"""Refused pack references and call-level pack rules on the tiny engine: every code and param path of ``api.md``
§4.10 (packs spec §5.1, §5.2), and what step 10 does to the request before the rest of validation."""

from __future__ import annotations

import copy

import pytest

from spinf.errors import ApiError
from tests.packs import call_packs

MOD = "tiny/moderation"
P = "scoring.packs.0"
TEXT = "Is this a nice day?"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    return call_packs.catalog(tmp_path_factory.mktemp("call-packs"))


def body(*refs: dict, queries: list | None = None, inputs: list | None = None, **scoring: object) -> dict:
    return {
        "inputs": inputs if inputs is not None else [{"id": "a", "messages": [{"role": "user", "content": TEXT}]}],
        "scoring": {"queries": queries or [], "packs": list(refs), **scoring},
    }


def own(query_id: str = "own", **fields: object) -> dict:
    return {"id": query_id, "template": "\n\nIs it nice?\nAnswer:{?}", "options": [" yes", " no"], **fields}


def refusals():
    mod = {"id": MOD}
    yield "packs-type", body(), {"packs": {"id": MOD}}, "invalid_field", "scoring.packs"
    yield "entry-type", body("x"), {}, "invalid_field", P
    yield "entry-key", body({"id": MOD, "mode": "max"}), {}, "invalid_field", f"{P}.mode"
    yield "id-empty", body({"id": ""}), {}, "invalid_field", f"{P}.id"
    yield "id-twice", body(mod, {"id": "tiny/support"}, mod), {}, "duplicate_id", "scoring.packs.2.id"
    yield "unknown", body({"id": "tiny/none"}), {}, "unknown_pack", f"{P}.id"
    yield "other-model", body({"id": "tiny/far"}), {}, "pack_not_available", f"{P}.id"
    yield "version-type", body({"id": MOD, "version": 1}), {}, "invalid_field", f"{P}.version"
    yield "version-null", body({"id": MOD, "version": None}), {}, "invalid_field", f"{P}.version"
    yield "context-null", body({"id": MOD, "context": None}), {}, "invalid_field", f"{P}.context"
    yield "include-null", body({"id": MOD, "include_queries": None}), {}, "invalid_field", f"{P}.include_queries"
    yield "decision-null", body({"id": MOD, "decision": None}), {}, "invalid_field", f"{P}.decision"
    yield "version-unknown", body({"id": MOD, "version": "9.9"}), {}, "unknown_pack_version", f"{P}.version"
    yield "coming-soon", body({"id": MOD, "version": "0.2.0"}), {}, "pack_not_available", P
    yield "context", body({"id": MOD, "context": "chat"}), {}, "invalid_field", f"{P}.context"
    yield "include-type", body({"id": MOD, "include_queries": "yes"}), {}, "invalid_field", f"{P}.include_queries"
    yield from decision_refusals()
    yield from call_refusals()


def decision_refusals():
    d = f"{P}.decision"

    def ref(pack_id: str = MOD, **decision: object) -> dict:
        return body({"id": pack_id, "decision": decision})

    yield "decision-type", body({"id": MOD, "decision": "max"}), {}, "invalid_field", d
    yield "decision-key", ref(mode="max", cutoff=0.5), {}, "invalid_field", f"{d}.cutoff"
    yield "mode-null", ref(mode=None), {}, "invalid_field", f"{d}.mode"
    yield "mode-unknown", ref(mode="vote"), {}, "invalid_field", f"{d}.mode"
    yield "mode-not-offered", ref("tiny/support", mode="max"), {}, "invalid_field", f"{d}.mode"
    yield "threshold-per-category", ref(mode="per_category", threshold=0.5), {}, "invalid_field", f"{d}.threshold"
    yield "threshold-default-per-category", ref("tiny/support", threshold=0.5), {}, "invalid_field", f"{d}.threshold"
    yield "threshold-max-range", ref(mode="max", threshold=1.5), {}, "invalid_field", f"{d}.threshold"
    yield "threshold-bool", ref(threshold=True), {}, "invalid_field", f"{d}.threshold"
    yield "threshold-string", ref(threshold="0.5"), {}, "invalid_field", f"{d}.threshold"
    yield "thresholds-type", ref(thresholds=[0.5]), {}, "invalid_field", f"{d}.thresholds"
    unknown = ref(thresholds={"general": 0.5, "rudeness": 0.1})
    yield "thresholds-unknown", unknown, {}, "unknown_category", f"{d}.thresholds.rudeness"
    yield "thresholds-range", ref(thresholds={"drugs": 2}), {}, "invalid_field", f"{d}.thresholds.drugs"
    yield "thresholds-bool", ref(thresholds={"drugs": False}), {}, "invalid_field", f"{d}.thresholds.drugs"
    yield "critical-type", ref(critical="general"), {}, "invalid_field", f"{d}.critical"
    yield "critical-item", ref(critical=["general", 3]), {}, "invalid_field", f"{d}.critical"
    yield "critical-unknown", ref(critical=["general", "nope"]), {}, "unknown_category", f"{d}.critical.1"


def call_refusals():
    mod = {"id": MOD}
    inputs = [{"id": "a", "messages": [{"content": TEXT}], "queries": [own("spam")]}]
    yield "own-id", body(mod, queries=[own("harmful")]), {}, "duplicate_id", "scoring.queries"
    yield "own-input-id", body(mod, inputs=inputs), {}, "duplicate_id", "scoring.queries"
    yield "pack-query-ids", body({"id": "tiny/support"}, {"id": "tiny/twin"}), {}, "pack_conflict", "scoring.packs"
    sent = body(mod, case_insensitive=True)
    yield "case-sent", sent, {}, "pack_conflict", "scoring.case_insensitive"
    yield "case-packs", body(mod, {"id": "tiny/loose"}), {}, "pack_conflict", "scoring.packs"
    group = body(mod, queries=[own(), own("g", group="tiny/moderation@0.1.0")])
    yield "reserved-group", group, {}, "reserved_group", "scoring.queries.1.group"
    yield "wrap-conflict", body(mod, {"id": "tiny/tone"}), {}, "pack_conflict", "scoring.packs"
    yield from parameter_refusals()
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    parts = [{"id": "a", "messages": [{"content": TEXT}, {"content": [{"type": "text", "text": "x"}, image]}]}]
    media = "inputs.0.messages.1.content.1.type"
    yield "media", body(mod, inputs=parts), {}, "pack_media_not_supported", media


def parameter_refusals():
    brand = {"id": "tiny/brand"}
    two = [
        {"id": "a", "messages": [{"content": TEXT}], "parameters": {"brand": "Kestrel"}},
        {"id": "b", "messages": [{"content": TEXT}], "parameters": {"tier": "gold"}},
    ]
    yield "parameter-missing", body(brand, inputs=two), {}, "invalid_field", "inputs.1.parameters"
    yield (
        "parameter-null",
        body(brand, inputs=[dict(two[0], parameters={"brand": None})]),
        {},
        "invalid_field",
        ("inputs.0.parameters"),
    )
    unknown = [dict(two[0], parameters={"brand": "K", "colour": "red"})]
    yield "parameter-unknown", body(brand, inputs=unknown), {}, "invalid_field", "inputs.0.parameters"
    yield (
        "parameters-type",
        body(brand, inputs=[dict(two[0], parameters=["K"])]),
        {},
        "invalid_field",
        ("inputs.0.parameters"),
    )
    nested = [dict(two[0], parameters={"brand": ["K"]})]
    yield "parameter-value", body(brand, inputs=nested), {}, "invalid_field", "inputs.0.parameters.brand"


@pytest.mark.parametrize(
    ("request_body", "scoring", "code", "param"), [r[1:] for r in refusals()], ids=[r[0] for r in refusals()]
)
def test_refused(tiny_engine, catalog, request_body, scoring, code, param):
    request_body = copy.deepcopy(request_body)
    request_body["scoring"].update(scoring)
    with pytest.raises(ApiError) as info:
        tiny_engine.score(request_body, packs=catalog)
    error = info.value
    assert (error.status, error.code, error.param) == (400, code, param), error.message


def messages_body(*refs: dict, messages: list | None = None) -> dict:
    return {"messages": messages or [{"content": TEXT}], "scoring": {"queries": [], "packs": list(refs)}}


def test_the_messages_form_reports_its_own_params(tiny_engine, catalog):
    with pytest.raises(ApiError) as info:
        tiny_engine.score(messages_body({"id": "tiny/brand"}), packs=catalog)
    assert (info.value.code, info.value.param) == ("invalid_field", "messages.parameters")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(ApiError) as info:
        tiny_engine.score(messages_body({"id": MOD}, messages=[{"content": [image]}]), packs=catalog)
    assert (info.value.code, info.value.param) == ("pack_media_not_supported", "messages.0.content.0.type")


def test_packs_off_refuse_every_id(tiny_engine):
    with pytest.raises(ApiError) as info:
        tiny_engine.score(body({"id": MOD}))
    assert (info.value.code, info.value.param) == ("unknown_pack", f"{P}.id")
    assert "GET /v1/packs" in info.value.message


def test_references_are_shape_checked_before_any_is_looked_up(tiny_engine, catalog):
    with pytest.raises(ApiError) as info:
        tiny_engine.score(body({"id": "tiny/none"}, {"id": MOD, "threshold": 0.5}), packs=catalog)
    assert (info.value.code, info.value.param) == ("invalid_field", "scoring.packs.1.threshold")


def test_an_evaluation_failure_is_an_engine_error(tiny_engine, catalog):
    with pytest.raises(ApiError) as info:
        tiny_engine.score(body({"id": "tiny/broken"}), packs=catalog)
    assert (info.value.status, info.value.code, info.value.param) == (500, "engine_error", None)
    assert info.value.message.startswith("pack evaluation failed for tiny/broken 1.0.0 on input 'a'")


def test_pack_templates_are_exempt_from_max_query_tokens(tiny_engine, catalog):
    tight = {**body({"id": MOD}), "limits": {"max_query_tokens": 2}}
    response = tiny_engine.score(tight, packs=catalog, trusted=True)
    assert [entry["id"] for entry in response["results"][0]["packs"]] == [MOD]
    tight["scoring"]["queries"] = [own()]
    with pytest.raises(ApiError) as info:
        tiny_engine.score(tight, packs=catalog, trusted=True)
    assert (info.value.code, info.value.param) == ("template_too_long", "scoring.queries.0.combinations.0")


@pytest.mark.parametrize("decision", [{"mode": "micro_layer", "threshold": -40}, {"mode": "max", "threshold": 1}])
def test_accepted_thresholds(tiny_engine, catalog, decision):
    response = tiny_engine.score(body({"id": MOD, "decision": decision}), packs=catalog)
    got = response["results"][0]["packs"][0]["decision"]
    assert (got["mode"], got["threshold"]) == (decision["mode"], float(decision["threshold"]))
    assert type(got["threshold"]) is float  # a per-call threshold is returned as a float (packs spec §5.4)


def test_null_decision_values_count_as_absent(tiny_engine, catalog):
    nulls = {"threshold": None, "thresholds": None, "critical": None}
    with_nulls = tiny_engine.score(body({"id": MOD, "decision": nulls}), packs=catalog)
    plain = tiny_engine.score(body({"id": MOD}), packs=catalog)
    assert with_nulls["results"] == plain["results"]


def test_an_empty_pack_list_and_a_top_level_packs_key_do_nothing(tiny_engine, catalog):
    plain = body(queries=[own()])
    del plain["scoring"]["packs"]
    expected = tiny_engine.score(plain)
    for variant in (body(queries=[own()]), {**plain, "packs": [{"id": MOD}]}):
        response = tiny_engine.score(variant, packs=catalog)
        assert response["results"] == expected["results"] and "packs" not in response["usage"]
        assert "packs" not in response["results"][0]
