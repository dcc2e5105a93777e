"""The OpenAPI 3.1 document of ``GET /openapi.json`` (api spec §1, D7): every route, its real request and responses.

It owns the machine-readable copy of the HTTP contract: the routes of §1 with their auth, parameters and bodies, the
score response of §5 (chat adds ``choices``, §6), the decisions request and response (D11, docs/decisions.md: the
``openai`` SDK's shapes, unknown request keys allowed as in a score body), the model entry of §7, the pack listings of
§8, the probes, drain and info of §3, and the error envelope of §2.5 with its code table (``ERROR_CODES``), narrowed
per status. The score request of §4 is not written here: `spinf.protocol.schema` declares it once, for the parser's
checks and for this document, which embeds its components and adds what the table cannot hold: the bounds that are
settings (this server's limits), the served model's names as a pattern, and the rules across fields in words.
The request schemas state what the parsers enforce (issue 33 item 9): a body they accept is refused for its shape
only by a rule an object's description states. The other schemas are plain dicts built by small helpers: in an
object's field map a key ending in ``?`` is optional. Response objects are closed, so an answer with a key the spec
does not list fails validation. It imports nothing from the server: the request's schema table and the names'
pattern are `spinf.protocol`'s, the limits `spinf.settings`'; ``tests/server/test_openapi.py`` checks it against the
app's routes, the parsers and real answers.
"""

from __future__ import annotations

from spinf.decisions import MAX_CHOICES, MAX_LEVELS, MAX_QUESTIONS
from spinf.decisions.request import JSON_MAX_BYTES, JSON_MAX_DEPTH, JSON_MAX_VALUES, MIN_CHOICES, MIN_LEVELS
from spinf.protocol.names import casefold_pattern
from spinf.protocol.schema import DATA_URL, DETAILS, MODES
from spinf.protocol.schema import components as request_components
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
REQUEST_ID = r"^scr_[0-9A-HJKMNP-TV-Z]{26}$"
_DEFAULT_LIMITS = Limits()  # frozen, so one shared default is safe
RETRY_AFTER = {429: "2", 503: "10 (warming_up, or shutting down) or 60 (model_unavailable)"}

# Small schema builders.


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def bounded(kind: str, lo=None, hi=None, **extra) -> dict:
    """A string (length), integer or number (value), or array (items) with optional inclusive bounds."""
    names = {"string": "Length", "array": "Items"}
    suffix = names.get(kind)
    schema = {"type": kind}
    if lo is not None:
        schema[f"min{suffix}" if suffix else "minimum"] = lo
    if hi is not None:
        schema[f"max{suffix}" if suffix else "maximum"] = hi
    return {**schema, **extra}


def string(lo=None, hi=None, **extra) -> dict:
    return bounded("string", lo, hi, **extra)


def integer(lo=0, hi=None, **extra) -> dict:
    return bounded("integer", lo, hi, **extra)


def number(lo=None, hi=None, **extra) -> dict:
    return bounded("number", lo, hi, **extra)


def array(items: dict, lo=None, hi=None, **extra) -> dict:
    return bounded("array", lo, hi, items=items, **extra)


def enum(*values) -> dict:
    return {"enum": list(values)}


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, NULL]}


def mapping(values: dict, **extra) -> dict:
    return {"type": "object", "additionalProperties": values, **extra}


def same(schema: dict, keys: str) -> dict:
    """The same schema for each of the space-separated ``keys`` (a trailing ``?`` marks one optional)."""
    return {key: schema for key in keys.split()}


def obj(fields: dict, *, closed: bool = True, **extra) -> dict:
    """An object; a key ending in ``?`` is optional, the others required; a closed object allows no other key."""
    schema = {"type": "object", "properties": {key.rstrip("?"): value for key, value in fields.items()}, **extra}
    required = [key for key in fields if not key.endswith("?")]
    if required:
        schema["required"] = required
    if closed:
        schema["additionalProperties"] = False
    return schema


def loose(fields: dict, **extra) -> dict:
    """An open object: keys other than ``fields`` are allowed."""
    return obj(fields, closed=False, **extra)


def described(schema: dict, text: str) -> dict:
    return {**schema, "description": text}


STR, BOOL, NULL, ANY = {"type": "string"}, {"type": "boolean"}, {"type": "null"}, {}
INT, NUM, P = integer(), number(), number(0, 1)

# §4: the request body, as `spinf.protocol.schema` declares it, with what the table cannot hold: the bounds that are
# settings, and in each object's description the rules a schema cannot state (they read another field, the template,
# the pack or the model), each with the code it is refused with in parentheses.
RULES_IN_WORDS = {
    "ScoreRequest": "Rules across fields: input ids are unique, and so are the shared query ids (duplicate_id); "
    "an input's query_ids name shared queries (unknown_query_id), and the queries an input gets have distinct ids "
    "(duplicate_id), at least one (empty_queries); model names the served model (model_not_served); a trusted "
    "caller's limits lower the bounds below for its call; media parts need a model that reads them and a server "
    "that allows them (media_not_supported, media_disabled), and data that decodes within the limits "
    "(invalid_media, image_too_large, audio_too_long); pack references are checked against the pack "
    "catalog (unknown_pack, pack_conflict, invalid_field ...).",
    "Query": "Rules across fields (§4.5-§4.8): the template's slot decides the other fields (allOf states those "
    "that hold whatever the slot). A {?} query needs options (missing_value), unique after trimming and "
    "casefolding unless scoring.case_insensitive is false (duplicate_option), and takes no max_tokens, top_k, "
    "calibration or generate (invalid_field); an extraction slot takes no options, generate only on {*}, top_k "
    "and calibration not with generate, max_tokens above 64 only with generate (invalid_field). The template has "
    "at most 5 distinct placeholders (invalid_template); its placeholders and the keys of combinations (or of "
    'values, with "all") are the same (missing_value, unknown_placeholder); "all" gives at most 1,000 '
    "combinations (too_many_combinations) of values of at most 256 characters (invalid_field).",
    "VideoPart": "Rules across fields: the frames' t do not decrease (invalid_field).",
}


# The slot rules of §4.5 that hold whatever the template's slot (`spinf.protocol.request._check_slot_fields`): options
# (a {?} query's) go with none of the extraction fields; generating (true or an object) with neither top_k nor
# calibration; max_tokens above 64 only when generating.
_GENERATING = {"required": ["generate"], "properties": {"generate": {"anyOf": [{"const": True}, {"type": "object"}]}}}
_ANY_OF_KEYS = {"anyOf": [{"required": [key]} for key in ("max_tokens", "top_k", "calibration")]}
QUERY_EXCLUSIONS = [
    {"if": {"required": ["options"]}, "then": {"not": _ANY_OF_KEYS, "properties": {"generate": NULL}}},
    {"if": _GENERATING, "then": {"not": {"anyOf": _ANY_OF_KEYS["anyOf"][1:]}}},
    {"if": {"required": ["max_tokens"], "properties": {"max_tokens": {"minimum": 65}}}, "then": _GENERATING},
]


def _request_schemas(limits: Limits, model_names: tuple[str, ...]) -> dict:
    """The request's components, with the server's limits where a schema bound is a setting (a trusted call may
    lower them, ScoreRequest's description says), the model's names, and each object's rules in words."""
    schemas = request_components()
    schemas["ScoreRequest"]["properties"]["model"] |= _model_schema(model_names)
    options = schemas["Query"]["properties"]["options"]
    options["maxItems"] = limits.max_options  # too_many_options (§4.8)
    options["description"] += f"; at most max_options ({limits.max_options:,} here)"
    schemas["Query"]["allOf"] = QUERY_EXCLUSIONS
    frames = schemas["VideoPart"]["properties"]["video"]["properties"]["frames"]
    frames |= {"maxItems": limits.max_frames, "description": f"1 to max_frames ({limits.max_frames:,} here)"}
    for name, rules in RULES_IN_WORDS.items():
        schemas[name]["description"] = " ".join(filter(None, (schemas[name].get("description"), rules)))
    stream = described(ANY, "true: the answer as server-sent events; any other value, or none: JSON")
    schemas["ChatRequest"] |= {"properties": {"stream": stream}}
    return schemas


def _model_schema(names: tuple[str, ...]) -> dict:
    """The schema of a request's ``model``: any of ``names`` compared as the parser compares (`str.casefold`), when
    the server's names are known; else a non-empty string."""
    if not names:
        return {}
    text = f"one of {', '.join(dict.fromkeys(names))}, compared case-insensitively (model_not_served)"
    pattern = casefold_pattern(names)
    return {"description": text} if pattern is None else {"pattern": pattern, "description": text}


# §5: the response body.


def _response_schemas() -> dict:
    values = mapping(STR)
    option = obj({"text": STR, "logprob": number(None, 0), "p": P, "floor_p": nullable(P)})
    combination = obj({"values": values, "options": array(option), "residual": P, "floor_residual": nullable(P)})
    answer = obj({"text": STR, "p": P, "value?": NUM, "currency?": nullable(enum("$", "€", "£", "¥"))})
    searched = obj(
        {"values": values, "answers": array(answer), "mass": number(0), "p_negative?": nullable(P), "p_calibrated?": P}
    )
    sequence = obj({"text": STR, "finish": enum("stop", "length")})
    generated = obj({"values": values, "answers": array(sequence, 1, 6)})
    decision = obj(
        {
            "unsafe": BOOL,
            "mode": enum(*MODES),
            **same(NUM, "score? threshold?"),
            "category?": nullable(STR),
            "categories?": array(STR),
            "critical?": array(STR, 1),
            "by?": {"const": "critical"},
            "warning?": STR,
        }
    )
    category = obj({"score": P, "percentile": nullable(NUM), "flagged": nullable(BOOL)})
    return {
        "ScoredQuery": obj({"id": STR, "combinations": array(combination)}),
        "SearchedQuery": obj({"id": STR, "kind": enum("text", "number", "currency"), "combinations": array(searched)}),
        "GeneratedQuery": obj(
            {"id": STR, "kind": {"const": "text"}, "generate": {"const": True}, "combinations": array(generated)}
        ),
        "QueryResult": {"oneOf": [ref("ScoredQuery"), ref("SearchedQuery"), ref("GeneratedQuery")]},
        "PackResult": obj({**same(STR, "id version context"), "categories": mapping(category), "decision": decision}),
        "Result": obj({"input_id": STR, "queries": array(ref("QueryResult")), "packs?": array(ref("PackResult"))}),
        "Warning": {
            "oneOf": [
                obj({"code": {"const": "low_option_mass"}, **same(STR, "input_id query_id message")}),
                obj({"code": {"const": "join_not_merged"}, **same(STR, "message param")}),
                obj(
                    {"code": {"const": "ignored_field"}, **same(STR, "message param")},
                    description="a trusted caller's limits or features key that the server does not know (4.11)",
                ),
            ]
        },
        "Usage": _usage(),
        "Timing": obj(same(INT, "wall_ms queue_ms compile_ms score_ms gpu_busy_ms decode_ms?")),
        "EngineInfo": obj(
            {
                **same(STR, "engine image model revision quant gpu capability torch transformers python"),
                **same(integer(1), "token_budget max_tokens layers"),
                "cuda_graphs": described(BOOL, "whether small passes replay CUDA graphs (never on the CPU)"),
                "lm_head": described(enum("f32out", "bf16", "fp32"), "the LM head's precision (fingerprint part 7)"),
                "batch_invariant": described(BOOL, "bit-identical scores whatever shares the call (api spec 5.10)"),
                "cuda": nullable(STR),
                **same(nullable(STR), "triton tokenizers safetensors numpy"),  # null: not installed
                "fla?": described(STR, "fla-core's version, when installed"),
                "scale_table?": described(ANY, "only when there is one"),
            }
        ),
        "ScoreResponse": _score_response(chat=False),
        "ChatResponse": _score_response(chat=True),
    }


def _usage() -> dict:
    content = same(INT, "tokens text_tokens images image_tokens video_frames video_tokens audio_tokens")
    internals = """packed_tokens content_tokens text_tokens query_tokens floor_tokens generated_tokens images
        image_tokens video_frames video_tokens audio_ms audio_tokens"""
    return obj(
        {
            **same(INT, "prompt_tokens completion_tokens total_tokens"),
            "prompt_tokens_details": obj(same(INT, "content_tokens text_tokens query_tokens floor_tokens")),
            "inputs": integer(1),
            "content": obj({**content, "audio_seconds": number(0)}),
            "scoring": obj(same(INT, "queries combinations options prompts floor_prompts query_tokens floor_tokens")),
            "extraction?": obj(same(INT, "slots text number currency answers decode_tokens")),
            "generation?": obj(same(INT, "slots sequences max_tokens generated_tokens")),
            "packs?": obj(same(INT, "count query_tokens")),
            "processed_tokens": INT,
            "billed_tokens": integer(1000, description="max(prompt_tokens, 1000), as the hosted API bills (D10)"),
            **{f"{key}?": described(INT, "trusted or --debug only") for key in internals.split()},
        }
    )


def _score_response(*, chat: bool) -> dict:
    fields = {
        "id": string(pattern=REQUEST_ID, description="equals the X-Request-Id header"),
        "object": {"const": "score"},
        "created": described(INT, "Unix seconds"),
        "model": described(STR, "the name as sent; the served id when omitted"),
        "endpoint?": string(1, 128, description="only when the request had one"),
        "system_fingerprint": string(pattern=r"^fp_[0-9a-f]{10}$"),
        "results": array(ref("Result"), 1, description="one per input, in request order"),
        "warnings": array(ref("Warning")),
        "usage": ref("Usage"),
        "timing": ref("Timing"),
        "engine?": described(ref("EngineInfo"), "trusted caller or --debug only"),
    }
    return obj({**fields, "choices": array(ANY, hi=0)} if chat else fields)


# D11: POST /v1/decisions, the openai SDK's DecisionCreateParams and Decision (docs/decisions.md).


# A character that `str.strip` keeps (Python's whitespace, written out so ECMA-262 reads the class the same way).
NOT_BLANK = r"[^\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
DECISION_RULES = (
    "Rules across fields: a function_call_output's (custom_tool_call_output's) call_id is the call_id of an "
    "earlier function_call (custom_tool_call) item (invalid_field); the choices' values, and the levels' labels, "
    'of a question are unique, typed: the string "true" and true differ (duplicate_option). The body is then '
    "scored as a /v1/score body (docs/decisions.md), whose refusals come back on this body's params: model names "
    "the served model (model_not_served), an input_image is a valid image (invalid_media, image_too_large), the "
    "input and each question within the token limits (content_too_long, template_too_long, option_too_long)."
)


def _decision_schemas(model_names: tuple[str, ...]) -> dict:
    text = loose({"type": {"const": "input_text"}, "text": STR})
    image = loose({"type": {"const": "input_image"}, "image_url": string(pattern=DATA_URL),
                   "detail?": nullable(enum(*DETAILS))},
                  description="a data URL, read as a score body's image_url part where it stands (invalid_media); "
                  "not a file_id (400 media_not_supported)")  # fmt: skip
    data = {"anyOf": [{"type": "object"}, array({"type": "object"})]}
    json_part = loose({"type": {"const": "input_json"}, "data": data}, description=(
        f"rendered as compact JSON; at most {JSON_MAX_DEPTH} container levels, {JSON_MAX_VALUES:,} values and "
        f"{JSON_MAX_BYTES // 1024} KiB"))  # fmt: skip
    parts = {"user": [text, image, json_part], "developer": [text], "system": [text]}
    parts["assistant"] = [loose({"type": {"const": "output_text"}, "text": STR}),
                          loose({"type": {"const": "refusal"}, "refusal": STR})]  # fmt: skip
    messages = [
        loose(
            {"type?": {"const": "message"}, "role": {"const": role}, "content": {"anyOf": [STR, array({"oneOf": p})]}}
        )
        for role, p in parts.items()
    ]
    tool_output = {"anyOf": [STR, array({"oneOf": [text, image]})]}
    namespace = {"namespace?": nullable(STR)}
    tools = [
        loose(
            {"type": {"const": "function_call"}, **same(STR, "call_id name arguments"), "namespace?": nullable(STR)}
        ),
        loose({"type": {"const": "function_call_output"}, "call_id": STR, "output": tool_output}),
        loose({"type": {"const": "custom_tool_call"}, **same(STR, "call_id name input"), **namespace}),
        loose({"type": {"const": "custom_tool_call_output"}, "call_id": STR, "output": tool_output}),
    ]
    # text only: the instructions become a prompt template (an input_image there is 400 media_not_supported)
    instructions = {"anyOf": [string(pattern=NOT_BLANK), array({"oneOf": [text, json_part]}, 1)]}
    value = {"anyOf": [STR, BOOL]}
    choice = loose({"value": value, "description?": nullable(STR)})
    level = loose({"label": STR, "description?": nullable(STR)})
    head = {"instructions": instructions, "name?": nullable(STR)}
    question = {"oneOf": [
        loose({"type": {"const": "predicate"}, **head}),
        loose({"type": {"const": "choice"}, **head, "choices": array(choice, MIN_CHOICES, MAX_CHOICES)}),
        loose({"type": {"const": "score"}, **head, "levels": array(level, MIN_LEVELS, MAX_LEVELS)}),
    ]}  # fmt: skip
    request = loose(
        {
            "model": described(string(1), "a name of the served model (api spec 9.6)") | _model_schema(model_names),
            "input": {"anyOf": [STR, array({"oneOf": messages + tools}, 1)]},
            "questions": array(question, 1, MAX_QUESTIONS),
            **same(nullable(STR), "prompt_cache_key? safety_identifier?"),
            "prompt_cache_options?": described(nullable({"type": "object"}), "accepted and ignored"),
        },
        description=DECISION_RULES,
    )
    named = {"name": nullable(STR)}
    answer = {"oneOf": [
        obj({"type": {"const": "predicate"}, **named, "probability": P}),
        obj({"type": {"const": "choice"}, **named, "choice": value, "confidence": P,
             "probabilities": array(obj({"value": value, "probability": P}))}),
        obj({"type": {"const": "score"}, **named, "score": number(0), "confidence": P,
             "probabilities": array(obj({"label": STR, "value": INT, "probability": P}))}),
        obj({"type": {"const": "refusal"}, **named}),
    ]}  # fmt: skip
    usage = obj(
        {
            **same(INT, "input_tokens output_tokens total_tokens"),
            "input_tokens_details": obj(same(INT, "cached_tokens cache_write_tokens")),
            "output_tokens_details": obj({"reasoning_tokens": INT}),
        }
    )
    response = obj(
        {
            "id": string(pattern=REQUEST_ID, description="equals the X-Request-Id header"),
            "object": {"const": "decision"},
            "model": described(STR, "the name as sent"),
            "answers": array(answer, 1, MAX_QUESTIONS, description="in question order"),
            "usage": usage,
        }
    )
    return {"DecisionRequest": request, "DecisionResponse": response}


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
                **_request_schemas(limits, model_names),
                **_response_schemas(),
                **_decision_schemas(model_names),
                **_other_schemas(),
            },
            "responses": {f"Error{status}": error(status) for status in _ERROR_DESCRIPTIONS},
            "headers": {"X-Request-Id": request_id},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "the access token"}},
        },
    }
