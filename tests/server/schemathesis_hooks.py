"""The schemathesis check of api spec §2.5, loaded into ``schemathesis run`` through ``SCHEMATHESIS_HOOKS``.

`error_envelope` is written from the spec's table, not from the OpenAPI document, so a document that drifted from
the spec together with the server would still fail it. `tests/server/test_schemathesis.py` runs it.
"""

from __future__ import annotations

import schemathesis

from spinf.openapi import ERROR_CODES

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
