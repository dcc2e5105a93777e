"""The OpenAPI 3.1 document of ``GET /openapi.json`` (api spec §1, D7): every route, its real request and responses.

It owns the machine-readable copy of the HTTP contract: the routes of §1 with their auth, parameters and bodies, the
model entry of §7, the pack listings of §8, the probes, drain and info of §3, and the error envelope of §2.5 with its
code table (``ERROR_CODES``), narrowed per status. The bodies of the scoring routes (§4, §5, §6, D11) are
`spinf.server.schemas`', written with the same builders. It imports nothing else of the server: the request's
schema table and the names' pattern are `spinf.protocol`'s, the limits `spinf.settings`';
``tests/server/test_openapi.py`` checks it against the app's routes, the parsers and real answers.
"""

from __future__ import annotations

from spinf.protocol.schema import DETAILS, MODES
from spinf.server.schemas import (
    ANY,
    BOOL,
    INT,
    NULL,
    NUM,
    REQUEST_ID,
    STR,
    array,
    decision_schemas,
    described,
    enum,
    integer,
    loose,
    nullable,
    number,
    obj,
    ref,
    request_schemas,
    response_schemas,
    same,
    string,
)
from spinf.settings import Limits

# §2.5: every code, by status. The 404 pack codes belong to GET /v1/packs/{id} and the 404 model_not_served to
# GET /v1/models/{id}; in a score body they are 400s.
ERROR_CODES: dict[int, tuple[str, ...]] = {
    400: tuple(
        """invalid_json invalid_field scoring_required model_not_served media_not_supported media_disabled
        extraction_disabled generation_disabled invalid_template missing_value unknown_placeholder
        too_many_combinations too_many_options duplicate_option option_too_long option_boundary template_too_long
        duplicate_id unknown_query_id empty_queries too_many_extractions too_many_prompts content_too_long
        unsupported_content invalid_media audio_too_long image_too_large unknown_pack unknown_pack_version
        pack_not_available pack_conflict reserved_group unknown_category pack_media_not_supported
        invalid_http""".split()
    ),
    401: ("invalid_token",),
    403: ("forbidden_host", "forbidden_origin"),
    404: ("not_found", "unknown_pack", "unknown_pack_version", "model_not_served"),
    405: ("method_not_allowed",),
    408: ("body_timeout",),
    413: ("body_too_large", "request_too_large"),
    415: ("unsupported_content_type",),
    431: ("invalid_http",),
    429: ("concurrency_limit",),
    500: ("engine_error",),
    503: ("warming_up", "model_unavailable"),
    501: ("invalid_http",),
    505: ("invalid_http",),
}
ERROR_TYPES = ("invalid_request", "authentication_error", "not_found", "rate_limited", "unavailable", "api_error")
LIMIT_KEYS = """max_content_tokens max_query_tokens max_prompts_per_input max_processed_tokens
    max_extractions_per_input max_options max_option_tokens max_frames max_audio_seconds max_image_pixels
    max_request_pixels""".split()
MEDIA = ("image", "audio", "video")
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_DEFAULT_LIMITS = Limits()  # frozen, so one shared default is safe
RETRY_AFTER = {429: "2", 503: "10 (warming_up, or shutting down) or 60 (model_unavailable)"}

# §3, §7, §8 and §2.5: probes, models, packs, errors.


def _other_schemas() -> dict:
    model = obj(
        {
            **same(STR, "id name base_model"),
            "status": enum("loading", "available", "error"),
            "aliases": array(STR),
            "family": nullable(STR),
            "capabilities": array(enum("score", "extract", "generate"), uniqueItems=True),
            "media": array(enum(*MEDIA), uniqueItems=True),
            "limits": obj(same(INT, " ".join(LIMIT_KEYS))),
            "features": obj({"media": array(enum(*MEDIA)), **same(BOOL, "extraction generation")}),
            "image?": obj({"detail_tokens": obj(same(integer(1), " ".join(DETAILS)))}),
            "batch_invariant": described(BOOL, "scores are bit-identical whatever shares the call (api spec 5.10)"),
        }
    )
    common = {**same(STR, "id name description"), "tags": array(STR), "media": array(enum("text", *MEDIA))}
    pack_decision = obj(
        {
            **same(enum(*MODES), "mode fallback"),
            "modes": array(enum(*MODES)),
            "max_threshold": nullable(NUM),
            "critical": array(STR),
        }
    )
    pack = obj(
        {
            **common,
            **same(STR, "status version model source"),
            "versions": array(STR, 1),
            "parameters": array(
                obj({"id": STR, **same(STR, "label? description?"), "required?": BOOL, "default?": ANY})
            ),
            "contexts": array(obj(same(STR, "id template"))),
            "categories": array(obj({**same(STR, "id label"), "threshold": nullable(NUM)})),
            "decision": pack_decision,
            **same(INT, "queries prompts"),
        }
    )
    coming_soon = {"status": {"const": "coming_soon"}, "version": NULL, "versions": array(STR, hi=0)}
    error_detail = {"code": enum(*sorted({c for codes in ERROR_CODES.values() for c in codes})), "message": STR}
    error_detail["param"] = nullable(described(STR, "a param path"))
    return {
        "Boot": obj(
            {
                **same(number(0), "import_s load_s idle_gib warmup_s? warmup_extract_s?"),
                "weights": STR,
                "warm": {"const": True},
            }
        ),
        "Healthz": obj({"ok": {"const": True}}),
        "Ready": obj({"ready": {"const": True}, "boot": ref("Boot")}),
        "NotReady": obj(
            {
                "ready": {"const": False},
                **same(STR, "error? degraded?"),
                **same({"const": True}, "draining? stopping?"),
            },
        ),
        "Live": obj({"live": BOOL, "degraded?": STR}),
        "Drain": obj({"draining": BOOL}),
        "Info": obj({"engine": ref("EngineInfo"), "boot": ref("Boot")}),
        "Model": model,
        "OpenAIModel": obj(
            {
                "id": described(STR, "the served id, also when asked for by an alias"),
                "object": {"const": "model"},
                "created": described(INT, "Unix seconds: when this server started"),
                "owned_by": described(STR, "the namespace of the published name (spinf, a Hub organisation)"),
            }
        ),
        "Models": obj(
            {
                "models": array(ref("Model"), 1, 1),
                "object": {"const": "list"},
                "data": array(ref("OpenAIModel"), 1, 1, description="OpenAI's shape of the same model"),
            }
        ),
        "PackEntry": pack,
        "ComingSoonPack": obj({**common, **coming_soon, "model": {"anyOf": [STR, array(STR)]}}),
        "Packs": obj({"packs": array({"oneOf": [ref("PackEntry"), ref("ComingSoonPack")]}), "sources": array(STR)}),
        "PackReload": obj(
            {
                "applied": BOOL,
                "reason": nullable(enum("no_source", "catalog_errors", "official_lost")),
                "errors": array(STR),
                "official_error": nullable(STR),
                "sources": array(STR),
                **same(INT, "packs versions skipped"),
                "requests": described(integer(1), "the waiting reload requests this one reload answered"),
            }
        ),
        "PackFile": loose(
            same(ANY, "pack version model contexts scoring reads categories decision"),
            description="the pack file's JSON unchanged (packs.md §1)",
        ),
        "ErrorEnvelope": obj(
            {
                "error": obj({"type": enum(*ERROR_TYPES), **error_detail}),
                "request_id": string(pattern=REQUEST_ID, description="equals the X-Request-Id header"),
                "rejected?": described(obj(error_detail), "trusted callers only, on 400 and 413"),
            }
        ),
    }


# Responses and operations.

_REQUEST_ID_HEADER = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}
_ERROR_DESCRIPTIONS = {
    400: "an invalid request (§2.5, §4.12)",
    401: "a missing or wrong token, or a caller who is not trusted on /v0 (§2.3)",
    403: "a Host the server does not answer to (forbidden_host) or an Origin not allowed (forbidden_origin), ours "
    "(allowed_hosts, allowed_origins)",
    404: "an unknown path (not_found), an unknown pack id or version on /v1/packs/{id}, or a name the served model "
    "does not answer to on /v1/models/{id} (model_not_served)",
    405: "a known path called with a method it does not serve",
    408: "the body did not arrive within body_timeout_s (ours; the connection is closed)",
    413: "a body over max_body_bytes, or a call over max_processed_tokens, or out of device memory",
    415: "a body sent with an Origin header that is not declared JSON (unsupported_content_type, ours)",
    431: "header fields over 16 KiB (invalid_http, ours; the connection is closed)",
    429: "no free request slot",
    500: "an unhandled error (engine_error)",
    503: "the model is loading or warming up, failed to load, or the server is shutting down",
    501: "a transfer coding other than chunked (invalid_http, ours; the connection is closed)",
    505: "HTTP/2: this server speaks HTTP/1.1 only (invalid_http, ours; the connection is closed)",
}


def answer(description: str, schema: dict, media: str = "application/json", headers: dict | None = None) -> dict:
    headers = {**_REQUEST_ID_HEADER, **(headers or {})}
    return {"description": description, "headers": headers, "content": {media: {"schema": schema}}}


def error(status: int) -> dict:
    """An error answer: the envelope, its ``code`` narrowed to the codes of ``status``, with its headers."""
    narrowed = {"properties": {"error": {"properties": {"code": enum(*ERROR_CODES[status])}}}}
    headers = {}
    if status in RETRY_AFTER:
        text = f"seconds: {RETRY_AFTER[status]}"
        headers["Retry-After"] = {"description": text, "required": True, "schema": integer(1)}
    if status == 405:
        headers["Allow"] = {"description": "the methods the path serves", "required": True, "schema": STR}
    return answer(_ERROR_DESCRIPTIONS[status], {"allOf": [ref("ErrorEnvelope"), narrowed]}, headers=headers)


def _chat_answer() -> dict:
    """JSON, or with ``"stream": true`` server-sent events: one ``data:`` event holding the same JSON, then
    ``data: [DONE]`` (ours; the spec's §6 answers JSON either way, which the OpenAI SDK reads as no chunks)."""
    body = answer("Score, chat-shaped (§6)", ref("ChatResponse"))
    events = described(STR, 'with "stream": true: data: <the JSON answer>, then data: [DONE]')
    body["content"]["text/event-stream"] = {"schema": events}
    return body


# (path, method, operationId, auth, summary, 200 schema, error statuses); auth is "none", "access" (the access or
# the trusted token) or "trusted" (the trusted token only). The score routes also take a request body.
SCORING_ERRORS = (400, 401, 408, 413, 429, 500, 503)
ROUTES = (
    ("/healthz", "get", "healthz", "none", "The HTTP server is up", "Healthz", ()),
    ("/readyz", "get", "readyz", "none", "Readiness (§3.2)", "Ready", ()),
    ("/livez", "get", "livez", "none", "Liveness of the engine (§3.3)", "Live", ()),
    ("/metrics", "get", "metrics", "none", "Prometheus metrics (§3.5)", None, ()),
    ("/openapi.json", "get", "openapi", "none", "This OpenAPI 3.1 document", None, ()),
    ("/v0/drain", "post", "drainStart", "trusted", "Start draining (§3.4)", "Drain", (401, 500)),
    ("/v0/drain", "delete", "drainStop", "trusted", "Stop draining (§3.4)", "Drain", (401, 500)),
    ("/v0/info", "get", "info", "trusted", "Engine and boot (§3.6)", "Info", (401, 500, 503)),
    (
        "/v0/packs/reload",
        "post",
        "packsReload",
        "trusted",
        "Re-read the pack sources",
        "PackReload",
        (400, 401, 500, 503),
    ),
    ("/v1/models", "get", "models", "access", "The served model (§7)", "Models", (401, 500)),
    ("/v1/models/{id}", "get", "model", "access", "OpenAI's entry of the model (§7)", "OpenAIModel", (401, 404, 500)),
    ("/v1/packs", "get", "packs", "access", "The enabled packs (§8.1)", "Packs", (401, 500)),
    ("/v1/packs/{id}", "get", "pack", "access", "One pack file (§8.2)", "PackFile", (401, 404, 500)),
    ("/v1/score", "post", "score", "access", "Score (§4, §5)", "ScoreResponse", SCORING_ERRORS),
    ("/v1/chat/completions", "post", "chat", "access", "Score, chat-shaped (§6)", "ChatResponse", SCORING_ERRORS),
    (
        "/v1/decisions",
        "post",
        "decisions",
        "access",
        "The OpenAI Decisions API (D11)",
        "DecisionResponse",
        SCORING_ERRORS,
    ),  # fmt: skip
)
_SPECIAL = {  # answers other than a JSON 200 and the error envelopes
    "readyz": {"503": answer("not loaded, not warm, failed, degraded, draining or stopping", ref("NotReady"))},
    "livez": {"503": answer("not loaded, not warm, failed or degraded", ref("Live"))},
    "metrics": {"200": answer("Prometheus text exposition format", STR, media=METRICS_TYPE)},
    "openapi": {"200": answer("this document", {"type": "object"})},
    "chat": {"200": _chat_answer()},
}
_PACK_PARAMETERS = [
    {"name": "id", "in": "path", "required": True, "schema": STR, "description": "the pack id; it may contain /"},
    {"name": "version", "in": "query", "required": False, "schema": STR, "description": "default: the default"},
]
_MODEL_PARAMETERS = [
    {"name": "id", "in": "path", "required": True, "schema": STR, "example": "spinf/gemma-4-12b-fp8",
     "description": "the served id or an alias, case-insensitively; it may contain / (sent as is or as %2F)"},
]  # fmt: skip


_RELOAD_PARAMETERS = [
    {"name": "refresh", "in": "query", "required": False, "schema": enum("true", "false"),
     "description": "true: resolve the GitHub tags again (default false, or true with --packs-refresh)"},
]  # fmt: skip


def _paths() -> dict:
    paths: dict[str, dict] = {}
    for path, method, op_id, auth, summary, schema, errors in ROUTES:
        responses = {"200": answer(summary, ref(schema))} if schema else {}
        responses |= _SPECIAL.get(op_id, {}) | {str(s): {"$ref": f"#/components/responses/Error{s}"} for s in errors}
        op = {"operationId": op_id, "summary": summary, "security": [] if auth == "none" else [{"bearer": []}]}
        if auth == "trusted":
            op["description"] = "Trusted callers only (§2.4)."
        if op_id == "pack":
            op["parameters"] = _PACK_PARAMETERS
        if op_id == "model":
            op["parameters"] = _MODEL_PARAMETERS
        if op_id == "packsReload":
            op["parameters"] = _RELOAD_PARAMETERS
        if method == "post" and path.startswith("/v1/"):
            body = {"chat": "ChatRequest", "decisions": "DecisionRequest"}.get(op_id, "ScoreRequest")
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(body)}}}
        paths.setdefault(path, {})[method] = {**op, "responses": responses}
    return paths


def openapi_document(version: str, limits: Limits = _DEFAULT_LIMITS, model_names: tuple[str, ...] = ()) -> dict:
    """The OpenAPI 3.1 document of the server whose version is ``version``, whose request ``limits`` are these (the
    defaults when not given) and whose model answers to ``model_names`` (not stated when not given)."""
    description = (
        "Scoring server for decision models. Every response carries X-Request-Id. An unknown path is a 404 not_found "
        "and a known path with another method a 405 method_not_allowed with an Allow header (components Error404 "
        "and Error405), both in the error envelope; a trailing slash gets a 307 to the path without it. A server "
        "started without tokens is open and ignores the Authorization header. HTTP/1.1 only: a request that is "
        "not valid HTTP/1.1 gets 400, 431, 501 or 505 with code invalid_http (components Error400, Error431, "
        "Error501, Error505) and its connection is closed, on any path. On any path too, before the body is read: a "
        "Host the server does not answer to or an Origin not allowed is a 403 (Error403; the probes answer any "
        "Host), and a body sent with an Origin but not as JSON a 415 (Error415). Request bodies: an integer "
        "field takes no fraction, not even 16.0 (JSON Schema cannot tell it from 16; invalid_field), a number "
        "of more than 4,300 digits is not read (invalid_json), and an object's rules across fields are in its "
        "description."
    )
    request_id = {"description": "scr_ and a 26-character ULID", "schema": string(pattern=REQUEST_ID)}
    return {
        "openapi": "3.1.0",
        "info": {"title": "spinf-serve", "version": version, "description": description},
        "paths": _paths(),
        "components": {
            "schemas": {
                **request_schemas(limits, model_names),
                **response_schemas(),
                **decision_schemas(model_names),
                **_other_schemas(),
            },
            "responses": {f"Error{status}": error(status) for status in _ERROR_DESCRIPTIONS},
            "headers": {"X-Request-Id": request_id},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "the access token"}},
        },
    }
