"""The schemathesis checks of api spec §2.5 and D7, loaded into ``schemathesis run`` through ``SCHEMATHESIS_HOOKS``.

`error_envelope` is written from the spec's table, not from the OpenAPI document, so a document that drifted from
the spec together with the server would still fail it. `bodies_as_documented` holds the three scoring routes to
their request schemas in both directions (issue 33 item 9): it validates the body as sent against the document the
server serves, whatever mode schemathesis generated it in. A body the schema accepts is never refused for its shape
(a code of `SHAPE_CODES`) unless for a rule the document states in words (`IN_WORDS`); a body it refuses gets a 4xx.
`tests/server/test_schemathesis.py` runs them.
"""

from __future__ import annotations

import re

import schemathesis
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from spinf.errors import ApiError
from spinf.protocol.request import decode_json_body
from spinf.server.openapi import ERROR_CODES
from tests.protocol.document import Strict

TRUSTED = "Bearer boss"  # the trusted token test_schemathesis starts the server with
# §2.5: the error type of each status; any other 5xx is api_error, any other status invalid_request.
TYPES = {400: "invalid_request", 401: "authentication_error", 404: "not_found", 413: "invalid_request"}
TYPES |= {429: "rate_limited", 503: "unavailable"}
PROBES = ("/readyz", "/livez")  # their 503 has its own documented body, not the envelope


@schemathesis.check
def error_envelope(ctx, response, case) -> None:
    """An error answer is the envelope, as JSON, with the type and a code of its status and the request id;
    ``rejected`` repeats the error for a trusted caller on 400 and 413, and only then."""
    status = response.status_code
    if status < 400 or (status == 503 and case.operation.path in PROBES):
        return
    assert response.headers.get("content-type", [""])[0].startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body, dict), body
    error = body.get("error")
    assert isinstance(error, dict), body
    rejected = response.request.headers.get("Authorization") == TRUSTED and status in (400, 413)
    assert set(body) == {"error", "request_id", *(["rejected"] if rejected else [])}, body
    assert set(error) == {"type", "code", "message", "param"}, body
    assert error["type"] == TYPES.get(status, "api_error" if status >= 500 else "invalid_request"), body
    assert error["code"] in ERROR_CODES.get(status, ()), body
    assert isinstance(error["message"], str) and (error["param"] is None or isinstance(error["param"], str)), body
    assert body["request_id"] == response.headers["x-request-id"][0], body
    if rejected:
        assert body["rejected"] == {key: error[key] for key in ("code", "message", "param")}, body


SCORING = ("/v1/score", "/v1/chat/completions", "/v1/decisions")
# The codes of what a schema states: api spec §4.12 steps 1-4 and 11, the template grammar (a pattern), and the
# decisions body's shape.
SHAPE_CODES = (
    "invalid_json invalid_field unsupported_content scoring_required model_not_served invalid_template".split()
)
# The shape refusals of rules that the document states in words (an object's description), as (param, message).
_Q = r"(?:inputs\.\d+\.)?(?:scoring\.)?queries\.\d+"
IN_WORDS = tuple(
    (re.compile(param), re.compile(message))
    for param, message in (
        (_Q + r"\.template", r"the template has \d+ distinct placeholders; at most \d+"),  # Query
        (_Q, r".* apply only to extraction slots, not to a \{\?\} query"),
        (_Q + r"\.options", r"an extraction slot takes no options.*"),
        (_Q + r"\.generate", r"generate applies only to \{\*\} slots"),
        (_Q, r"top_k and calibration apply to searched slots.*"),
        (_Q, r"max_tokens above \d+ needs generate"),
        (_Q + r"\.combinations\.\d+\..*", r"the value of .* characters; at most \d+"),
        (r".*\.video\.frames\.\d+\.t", r"frame times must not decrease.*"),  # VideoPart
        (r"input\.\d+\.call_id", r"no earlier \w+ item has call_id .*"),  # DecisionRequest
        (r".*\.data", r"data (is nested deeper|holds more|is over) .*"),  # input_json's description
    )
)
_VALIDATORS: dict[tuple[int, str], Strict] = {}


def _body_validator(case) -> Strict:
    """The validator of the operation's JSON body schema, in the document the server serves, with integers read
    as the parser reads them (16.0 is not one: the one thing a schema cannot say, `tests.protocol.document`)."""
    document = case.operation.schema.raw_schema
    key = (id(document), case.operation.path)
    if key not in _VALIDATORS:
        registry = Registry().with_resource("urn:served", DRAFT202012.create_resource(document))
        at = case.operation.path.replace("~", "~0").replace("/", "~1")
        pointer = f"urn:served#/paths/{at}/post/requestBody/content/application~1json/schema"
        _VALIDATORS[key] = Strict({"$ref": pointer}, registry=registry)
    return _VALIDATORS[key]


@schemathesis.check
def bodies_as_documented(ctx, response, case) -> None:
    """A scoring body the document accepts is not refused for its shape, but for a rule it states in words; a body
    it refuses is refused with a 4xx."""
    request = response.request
    if case.operation.path not in SCORING or "json" not in request.headers.get("Content-Type", ""):
        return
    raw = request.body.encode() if isinstance(request.body, str) else request.body or b""
    try:
        body = decode_json_body(raw)  # as the server reads it: no NaN, no lone surrogate
    except ApiError:
        return  # not JSON: the 400 invalid_json of §2.1, which error_envelope checks
    valid = _body_validator(case).is_valid(body)
    status = response.status_code
    if not valid:
        assert 400 <= status < 500, f"a body the document refuses was answered {status}"
        return
    if status != 400:
        return
    error = response.json()["error"]
    if error["code"] not in SHAPE_CODES:
        return
    param, message = error["param"] or "", error["message"]
    stated = any(p.fullmatch(param) and m.fullmatch(message) for p, m in IN_WORDS)
    assert stated, f"a body the document accepts was refused: {error['code']} at {param!r}: {message}"
