"""``GET /openapi.json`` (api spec D7): the document is valid OpenAPI 3.1, names exactly the app's routes, and real
answers of the tiny-model server validate against the schemas it declares for them."""

from __future__ import annotations

import functools
import itertools
import re
from types import SimpleNamespace

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry
from referencing.jsonschema import DRAFT202012

import spinf
from spinf.catalog import resolve_model
from spinf.decisions import plan_decisions
from spinf.errors import ApiError
from spinf.protocol.request import parse_score_request
from spinf.protocol.templates import parse_template
from spinf.server.app import SERVED, WebServices, create_app
from spinf.server.lifecycle import Lifecycle
from spinf.server.models_entry import models_entry_for
from spinf.server.openapi import ERROR_CODES, openapi_document
from spinf.server.schemas import DECISION_RULES, RULES_IN_WORDS
from spinf.server.supervisor import running_actors, serve
from spinf.settings import Limits
from tests.protocol.bodies import FIXED
from tests.server.fakes import options

DOC = openapi_document(spinf.__version__)
DOC_URI = "urn:spinf:openapi"
REGISTRY = Registry().with_resource(DOC_URI, DRAFT202012.create_resource(DOC))
# The app's one route with a path converter, under the name the spec gives its parameter; `/v1/packs/` is the same
# route with the empty id (api spec §8.2: answered 404 unknown_pack).
RULE_PATHS = {"/v1/packs/<path:id>": "/v1/packs/{id}", "/v1/packs/": "/v1/packs/{id}"}
RULE_PATHS["/v1/models/<path:id>"] = "/v1/models/{id}"

RICH_BODY = {
    "model": "TINY",  # an alias, in another case: echoed as sent
    "endpoint": "triage",
    "scoring": {
        "queries": [
            {
                "id": "refund",
                "template": "\n\nDoes {who} want a {what}? Answer:{?}",
                "options": [" yes", " no"],
                "combinations": "all",
                "values": {"who": ["the customer", "the writer"], "what": ["refund", "reply"]},
            },
            {"id": "tone", "template": "\n\nThe tone is{?}", "options": [" calm", " very sad"], "empty_floor": False},
            {
                "id": "topic",
                "template": "\n\nIs this about {topic}? Answer:{?}",
                "options": [" yes", " no"],
                "combinations": [{"topic": "shipping"}, {"topic": "billing"}],
            },
        ]
    },
    "inputs": [
        {
            "id": "a",
            "messages": [
                {"role": "system", "content": "Support inbox."},
                {
                    "content": [
                        {"type": "text", "text": "My parcel never arrived."},
                        {"type": "text", "text": " Refund!"},
                    ]
                },
            ],
        },
        {
            "id": "b",
            "messages": [{"content": "Thanks, all good!"}],
            "query_ids": ["tone"],
            "queries": [{"id": "own", "template": "\n\nHappy? Answer:{?}", "options": [" yes", " no"]}],
        },
    ],
}


def pointer(*parts: str) -> str:
    return "/" + "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)


def declared(
    path: str, method: str, status: int, media: str = "application/json"
) -> tuple[dict, Draft202012Validator]:
    """The response object the document declares for a route and status, and a validator of its body schema."""
    response = DOC["paths"][path][method]["responses"][str(status)]
    at = ("paths", path, method, "responses", str(status))
    if "$ref" in response:
        at = tuple(response["$ref"].removeprefix("#/").split("/"))
        response = DOC["components"]["responses"][at[-1]]
    validator = Draft202012Validator(
        {"$ref": DOC_URI + "#" + pointer(*at, "content", media, "schema")}, registry=REGISTRY
    )
    return response, validator


def check(answer: httpx.Response, path: str, status: int | None = None) -> dict:
    """Validate a real answer against what the document declares for it; return its JSON body."""
    status = answer.status_code if status is None else status
    assert answer.status_code == status, answer.text
    response, validator = declared(path, answer.request.method.lower(), status)
    body = answer.json()
    validator.validate(body)
    for header, spec in response["headers"].items():
        if spec.get("required") or header == "X-Request-Id":
            assert header.lower() in answer.headers, header
    assert re.fullmatch(r"scr_[0-9A-HJKMNP-TV-Z]{26}", answer.headers["x-request-id"])
    if "error" in body:
        assert body["request_id"] == answer.headers["x-request-id"]
    return body


# The real /v1/models entry (api spec §7) of the tiny model, under the default limits.
tiny_models_entry = models_entry_for(
    resolve_model("spinf/tiny-gemma4"),
    SimpleNamespace(
        limits=Limits(),
        engine=SimpleNamespace(served_model=""),
        features=SimpleNamespace(extraction=True, generation=True, media=frozenset({"image", "audio", "video"})),
    ),
)


@pytest.fixture
async def server(tiny_engine, tmp_path, monkeypatch):
    """The tiny-model server on 127.0.0.1 with token ``tok`` and trusted token ``boss``, serving the document."""
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(tmp_path / "drain"))
    opts = options(token="tok", trusted_token="boss", max_body_bytes=65536)
    document = functools.partial(openapi_document, spinf.__version__)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(
                opts, lambda: tiny_engine, tiny_models_entry, openapi=document, task_status=task_status
            )
        )
        async with httpx.AsyncClient(base_url=binds[0], headers={"Authorization": "Bearer tok"}, timeout=30) as client:
            with trio.fail_after(30):
                while (await client.get("/readyz")).status_code != 200:
                    await trio.sleep(0.05)
            yield client
        nursery.cancel_scope.cancel()


def test_the_document_is_valid_openapi_3_1():
    validate_openapi(DOC)


def test_the_document_names_exactly_the_routes_of_the_app_with_their_methods():
    send, _ = trio.open_memory_channel(1)
    app = create_app(WebServices(Lifecycle(), send, trio.Semaphore(1), tiny_models_entry))
    served: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        path = RULE_PATHS.get(rule.rule, rule.rule)
        served.setdefault(path, set()).update(m.lower() for m in rule.methods if m in SERVED)
    documented = {path: set(item) - {"parameters", "summary", "description"} for path, item in DOC["paths"].items()}
    assert served == documented


def test_every_error_answer_is_the_envelope_with_the_codes_of_its_status():
    for path, item in DOC["paths"].items():
        for method, op in item.items():
            for status, response in op["responses"].items():
                if status == "200" or path in ("/readyz", "/livez"):  # probes answer 503 with their own body
                    continue
                assert response == {"$ref": f"#/components/responses/Error{status}"}, (path, method, status)
    for status, codes in ERROR_CODES.items():
        response = DOC["components"]["responses"][f"Error{status}"]
        envelope, narrowed = response["content"]["application/json"]["schema"]["allOf"]
        assert envelope == {"$ref": "#/components/schemas/ErrorEnvelope"}
        assert narrowed["properties"]["error"]["properties"]["code"]["enum"] == list(codes)
        assert ("Retry-After" in response["headers"]) == (status in (429, 503))


async def test_the_server_serves_the_document(server):
    assert check(await server.get("/openapi.json"), "/openapi.json") == DOC


async def test_a_rich_score_answer_validates(server):
    scored = await server.post("/v1/score", json=RICH_BODY)
    body = check(scored, "/v1/score", 200)
    assert body["id"] == scored.headers["x-request-id"] and body["model"] == "TINY" and body["endpoint"] == "triage"
    a, b = body["results"]
    assert [q["id"] for q in a["queries"]] == ["refund", "tone", "topic"]
    assert [q["id"] for q in b["queries"]] == ["tone", "own"]
    assert len(a["queries"][0]["combinations"]) == 4
    assert a["queries"][1]["combinations"][0]["floor_residual"] is None  # floor off
    assert a["queries"][0]["combinations"][0]["floor_residual"] is not None  # floor on
    trusted = check(
        await server.post("/v1/score", json=RICH_BODY, headers={"Authorization": "Bearer boss"}), "/v1/score"
    )
    assert "packed_tokens" in trusted["usage"]
    overridden = {**RICH_BODY, "limits": {"max_content_tokens": "1000", "max_tokens": 5}, "features": {"x": 1}}
    ignored = check(
        await server.post("/v1/score", json=overridden, headers={"Authorization": "Bearer boss"}), "/v1/score", 200
    )
    assert [(w["code"], w.get("param")) for w in ignored["warnings"][:2]] == [
        ("ignored_field", "limits.max_tokens"),
        ("ignored_field", "features.x"),
    ]
    assert ignored["warnings"][2:] == trusted["warnings"] and ignored["results"] == trusted["results"]
    chat = check(await server.post("/v1/chat/completions", json=RICH_BODY), "/v1/chat/completions", 200)
    assert chat["choices"] == [] and chat["results"] == body["results"]


EXTRACTION_BODY = {
    "messages": [{"content": "Order 1234 from Acme arrived 3 days late. I paid $45.50 and want a refund."}],
    "scoring": {
        "queries": [
            {"id": "vendor", "template": '\n\nThe vendor is "{*}"', "top_k": 2},
            {"id": "days", "template": "\n\nDays late:{n}", "max_tokens": 4},
            {"id": "paid", "template": "\n\nAmount paid:{$}", "max_tokens": 4, "calibration": {"a": 2}},
            {"id": "none", "template": "\n\nHow many days late?{n}", "max_tokens": 4},  # finds nothing
            {"id": "reply", "template": '\n\nReply: "{*}"', "max_tokens": 4, "generate": {"n": 2}},
        ]
    },
}


async def test_an_extraction_answer_validates(server):
    """Searched slots of every kind, one that finds nothing, and a generated slot, on both routes (§5.2, §5.7)."""
    body = check(await server.post("/v1/score", json=EXTRACTION_BODY), "/v1/score", 200)
    queries = body["results"][0]["queries"]
    assert [q["kind"] for q in queries] == ["text", "number", "currency", "number", "text"]
    assert queries[3]["combinations"][0]["answers"] == [] and "p_calibrated" in queries[2]["combinations"][0]
    assert {"extraction", "generation"} <= set(body["usage"]) and "decode_ms" in body["timing"]
    chat = check(await server.post("/v1/chat/completions", json=EXTRACTION_BODY), "/v1/chat/completions", 200)
    assert chat["results"] == body["results"]
    _, validator = declared("/v1/score", "post", 200)
    searched = queries[0]["combinations"][0]
    wrong = {**searched, "answers": [{**searched["answers"][0], "finish": "stop"}]}  # a searched answer has no finish
    changed = {**body, "results": [{"input_id": "0", "queries": [{**queries[0], "combinations": [wrong]}]}]}
    assert not validator.is_valid(changed)


async def test_a_score_answer_with_an_extra_key_does_not_validate(server):
    body = (await server.post("/v1/score", json=RICH_BODY)).json()
    _, validator = declared("/v1/score", "post", 200)
    assert not validator.is_valid({**body, "choices": []})
    assert not validator.is_valid({**body, "usage": {**body["usage"], "price": 1}})  # api spec §5.1: no price field
    usage = dict(body["usage"])
    assert usage.pop("billed_tokens") == 1000  # a small call is billed the minimum (§5.7, D10)
    assert not validator.is_valid({**body, "usage": usage})


async def test_error_envelopes_validate(server):
    trusted = {"Authorization": "Bearer boss"}
    rejected = check(await server.post("/v1/score", json={"inputs": []}, headers=trusted), "/v1/score", 400)
    assert rejected["rejected"]["code"] == "invalid_field"
    assert check(await server.post("/v1/score", content=b"{"), "/v1/score", 400)["error"]["code"] == "invalid_json"
    assert check(await server.post("/v1/chat/completions", json={"messages": []}), "/v1/chat/completions", 400)
    too_large = await server.post("/v1/score", content=b" " * 70000)
    assert check(too_large, "/v1/score", 413)["error"]["code"] == "body_too_large"
    anonymous = await server.get("/v1/models", headers={"Authorization": "Basic tok"})
    assert check(anonymous, "/v1/models", 401)["error"]["type"] == "authentication_error"
    assert check(await server.post("/v0/drain"), "/v0/drain", 401)["error"]["code"] == "invalid_token"
    assert check(await server.get("/v1/packs/acme/tone"), "/v1/packs/{id}", 404)["error"]["param"] == "id"
    assert (await server.get("/v1/models/")).headers["location"] == "/v1/models"  # the list's trailing slash (§1)
    for name in ("spinf/other", "spinf/tiny-gemma4/", "tiny%2F"):
        unserved = check(await server.get(f"/v1/models/{name}"), "/v1/models/{id}", 404)["error"]
        assert (unserved["code"], unserved["param"]) == ("model_not_served", "id")
    anonymous = await server.get("/v1/models/tiny", headers={"Authorization": "Bearer wrong"})
    assert check(anonymous, "/v1/models/{id}", 401)["error"]["code"] == "invalid_token"
    envelope = Draft202012Validator({"$ref": DOC_URI + "#/components/schemas/ErrorEnvelope"}, registry=REGISTRY)
    unknown = await server.get("/nope")
    assert unknown.status_code == 404 and envelope.is_valid(unknown.json())
    refused = await server.delete("/v1/score")
    assert refused.status_code == 405 and envelope.is_valid(refused.json()) and refused.headers["allow"] == "POST"


async def test_probes_models_packs_info_and_drain_validate(server):
    assert check(await server.get("/healthz"), "/healthz", 200) == {"ok": True}
    assert check(await server.get("/readyz"), "/readyz", 200)["boot"]["warm"] is True
    assert check(await server.get("/livez"), "/livez", 200) == {"live": True}
    models = check(await server.get("/v1/models"), "/v1/models", 200)
    assert models["models"][0]["id"] == "spinf/tiny-gemma4" and models["models"][0]["status"] == "available"
    assert models["object"] == "list" and [entry["id"] for entry in models["data"]] == ["spinf/tiny-gemma4"]
    for name in ("spinf/tiny-gemma4", "TINY", "spinf%2Ftiny-gemma4"):  # an alias; the / as the openai SDK sends it
        assert check(await server.get(f"/v1/models/{name}"), "/v1/models/{id}", 200) == models["data"][0]
    assert check(await server.get("/v1/packs"), "/v1/packs", 200) == {"packs": [], "sources": []}
    trusted = {"Authorization": "Bearer boss"}
    assert check(await server.get("/v0/info", headers=trusted), "/v0/info", 200)["engine"]["model"]
    assert check(await server.post("/v0/drain", headers=trusted), "/v0/drain", 200) == {"draining": True}
    assert check(await server.get("/readyz"), "/readyz", 503) == {"ready": False, "draining": True}
    assert check(await server.delete("/v0/drain", headers=trusted), "/v0/drain", 200) == {"draining": False}
    metrics = await server.get("/metrics")
    assert metrics.headers["content-type"] == next(
        iter(DOC["paths"]["/metrics"]["get"]["responses"]["200"]["content"])
    )


async def test_a_failed_load_answers_as_documented(tmp_path, monkeypatch):
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(tmp_path / "drain"))

    def broken():
        raise OSError("no such checkpoint")

    async with running_actors(options(token="x"), broken, tiny_models_entry) as running:
        client = create_app(running.services).test_client()
        with trio.fail_after(10):
            while running.services.lifecycle.error is None:
                await trio.sleep(0.01)
        for method, path, status in [
            ("GET", "/readyz", 503),
            ("GET", "/livez", 503),
            ("GET", "/v1/models", 200),
            ("POST", "/v1/score", 503),
        ]:
            extra = {"json": RICH_BODY} if method == "POST" else {}
            answer = await client.open(path, method=method, headers={"Authorization": "Bearer x"}, **extra)
            assert answer.status_code == status
            response, validator = declared(path, method.lower(), status)
            validator.validate(await answer.get_json())
            assert all(h in answer.headers for h, spec in response["headers"].items() if spec.get("required"))
        running.drain.stop()


# Issue 33 item 9: the request schemas state what the parsers enforce.


def test_the_document_states_the_servers_limits_where_a_bound_is_a_setting():
    def bounds(doc: dict) -> tuple[int, int]:
        schemas = doc["components"]["schemas"]
        frames = schemas["VideoPart"]["properties"]["video"]["properties"]["frames"]
        return schemas["Query"]["properties"]["options"]["maxItems"], frames["maxItems"]

    assert bounds(DOC) == (Limits().max_options, Limits().max_frames) == (1000, 1024)
    assert bounds(openapi_document(spinf.__version__, Limits(max_options=7, max_frames=3))) == (7, 3)


def test_every_rule_stated_in_words_is_in_its_objects_description():
    schemas = DOC["components"]["schemas"]
    for name, rules in RULES_IN_WORDS.items():
        assert schemas[name]["description"].endswith(rules), name
    assert schemas["DecisionRequest"]["description"] == DECISION_RULES


TEMPLATE = Draft202012Validator(
    {"$ref": DOC_URI + "#/components/schemas/Query/properties/template"}, registry=REGISTRY
)


def parses(template: str) -> bool:
    try:
        parse_template(template, "q")
    except ApiError as e:
        return "distinct placeholders" in e.message  # the one rule of the grammar stated in words
    return True


@FIXED
@given(st.text(st.sampled_from(list("{}?*$n\nab_ ")), max_size=16))
def test_the_template_pattern_takes_what_the_template_parser_takes(text):
    assert TEMPLATE.is_valid(text) == parses(text)


@pytest.mark.parametrize(
    "text",
    ["a{?}", "{{x}} {n}", "{a}{b}{n} {$}", "Says {*}. ", "{n} is {*}", "", "a{?}\n", "{?} b", "{?}{n}", "{*}\n", "{}"],
)
def test_the_template_pattern_on_cases(text):
    assert TEMPLATE.is_valid(text) == parses(text)


DECISION = Draft202012Validator({"$ref": DOC_URI + "#/components/schemas/DecisionRequest"}, registry=REGISTRY)
IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}


def question(**fields) -> dict:
    return {
        "model": "tiny",
        "input": "Refund me.",
        "questions": [{"type": "predicate", "instructions": "Upset?"} | fields],
    }


@pytest.mark.parametrize(
    "body",
    [
        question(instructions=" \u3000\n"),  # blank: refused although not empty
        question(instructions=[IMAGE]),  # an image in the instructions
        question(name=None),
        question(type="choice", choices=[{"value": "a", "description": None}, {"value": True}]),
        question(type="score", levels=[{"label": "low"}, {"label": "high", "description": None}]),
        {**question(), "input": [{"role": "user", "content": [{**IMAGE, "detail": None}]}]},
        {**question(), "input": [{"role": "assistant", "content": [{"type": "output_text"}]}]},
        {**question(), "input": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]},
        {**question(), "input": [{"role": "assistant", "content": [{"type": "refusal", "text": "no"}]}]},
    ],
)
def test_the_decisions_schema_takes_what_its_parser_takes(body):
    try:
        plan_decisions(body)
    except ApiError:
        accepted = False
    else:
        accepted = True
    assert DECISION.is_valid(body) == accepted


SCORE = Draft202012Validator({"$ref": DOC_URI + "#/components/schemas/ScoreRequest"}, registry=REGISTRY)
HUGE = 10**400  # no float holds it


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"template": "Who? {*}", "calibration": {"a": HUGE}}, "scoring.queries.0.calibration.a"),
        ({"template": "Who? {*}", "generate": {"top_p": HUGE}}, "scoring.queries.0.generate.top_p"),
    ],
)
def test_a_number_beyond_the_float_range_is_refused_as_the_document_says(query, param):
    """Regression: an integer of 400 digits where a number goes was a 500 (``math.isfinite`` overflowed)."""
    body = {"messages": [{"content": "x"}], "scoring": {"queries": [{"id": "q", **query}]}}
    assert not SCORE.is_valid(body)
    with pytest.raises(ApiError) as refused:
        parse_score_request(body)
    assert (refused.value.code, refused.value.param) == ("invalid_field", param)


NAMES = ("spinf/tiny-gemma4", "TINY", "Straße")  # "Straße" folds to "strasse": "STRASSE" and "straſſe" are it too
NAMED = openapi_document(spinf.__version__, model_names=NAMES)["components"]["schemas"]


@pytest.mark.parametrize(
    "schema", [NAMED["ScoreRequest"]["properties"]["model"], NAMED["DecisionRequest"]["properties"]["model"]]
)
@FIXED
@given(st.sampled_from(["tiny", "spinf/tiny-gemma4", "strasse", "x"]), st.data())
def test_the_model_pattern_takes_the_names_the_parser_takes(schema, name, data):
    """Each name, with its characters swapped for any that fold to them, or one changed: the pattern agrees with
    the parser's comparison (`str.casefold`) either way."""
    swaps = {"s": "sSſ", "ss": ["ss", "SS", "ß", "ẞ", "ſs"], "k": "kK\u212a"}
    pieces = [data.draw(st.sampled_from(list(swaps.get(c, c + c.upper())))) for c in name.replace("ss", "\0")]
    text = "".join(data.draw(st.sampled_from(swaps["ss"])) if p == "\0" else p for p in pieces)
    text += data.draw(st.sampled_from(["", "", "x", "\n", " "]))
    expected = text.casefold() in {known.casefold() for known in NAMES}
    assert Draft202012Validator(schema).is_valid(text) == expected


def test_without_names_the_model_is_any_non_empty_string():
    model = DOC["components"]["schemas"]["ScoreRequest"]["properties"]["model"]
    assert "pattern" not in model and model["minLength"] == 1


def test_a_name_too_foldable_for_a_pattern_is_named_in_words():
    """Every "ff" doubles the pattern (the ligature folds to it): past the size limit the names are only described."""
    model = openapi_document(spinf.__version__, model_names=("f" * 40,))["components"]["schemas"]["ScoreRequest"]
    assert "pattern" not in model["properties"]["model"] and "f" * 40 in model["properties"]["model"]["description"]


@pytest.mark.parametrize("value", ["5", "0005", "5\n", "0" * 4299 + "5", "0" * 4300 + "5", "-5", 5, 0])
def test_a_trusted_limit_as_digits_is_taken_as_the_document_says(value):
    """Regression: the digits' pattern took a final newline (Python's $) and any length, the parser neither."""
    body = {"messages": [{"content": "x"}], "limits": {"max_options": value}}
    try:
        parse_score_request(body, trusted=True)
    except ApiError as e:
        assert (e.code, e.param) == ("invalid_field", "limits.max_options")
        accepted = False
    else:
        accepted = True
    assert SCORE.is_valid(body) == accepted


QUERY = Draft202012Validator({"$ref": DOC_URI + "#/components/schemas/Query"}, registry=REGISTRY)
UNSET = object()
SLOT_FIELDS = {
    "options": [[" x"]],
    "max_tokens": [4, 70],
    "top_k": [2],
    "calibration": [{}],
    "generate": [None, False, True, {}],
}


@pytest.mark.parametrize("template", ["Upset?{?}", "Vendor: {*}", "Days:{n}", "Paid:{$}"])
def test_the_querys_exclusions_refuse_only_what_the_parser_refuses_whatever_the_slot(template):
    """Every mix of the slot fields: a query the schema refuses (its allOf) the parser refuses too, and the three
    exclusions the schema states are refused (options with an extraction field, generating with top_k, max_tokens
    above 64 without generating)."""
    refused_by_schema = 0
    for chosen in itertools.product(*([UNSET, *values] for values in SLOT_FIELDS.values())):
        query = {"id": "q", "template": template} | {
            k: v for k, v in zip(SLOT_FIELDS, chosen, strict=True) if v is not UNSET
        }
        try:
            parse_score_request({"messages": [{"content": "x"}], "scoring": {"queries": [query]}})
        except ApiError as e:
            accepted = e.code != "invalid_field"  # the other codes are the engine's later checks (missing_value ...)
        else:
            accepted = True
        if not QUERY.is_valid(query):
            refused_by_schema += 1
            assert not accepted, query
    assert refused_by_schema > 50  # so that a schema without the exclusions fails
