"""The bodies' schemas of the OpenAPI document (`spinf.server.openapi`): the request of §4, the response of §5 (chat
adds ``choices``, §6), and the decisions request and response (D11, docs/decisions.md), with the small builders the
whole document is written with.

The score request is not written here: `spinf.protocol.schema` declares it once, for the parser's checks and for
this document, which embeds its components and adds what the table cannot hold: the bounds that are settings (this
server's limits), the served model's names as a pattern, and the rules across fields in words. The request schemas
state what the parsers enforce (issue 33 item 9): a body they accept is refused for its shape only by a rule an
object's description states. In an object's field map a key ending in ``?`` is optional. Response objects are
closed, so an answer with a key the spec does not list fails validation.
"""

from __future__ import annotations

from spinf.decisions import MAX_CHOICES, MAX_LEVELS, MAX_QUESTIONS
from spinf.decisions.request import JSON_MAX_BYTES, JSON_MAX_DEPTH, JSON_MAX_VALUES, MIN_CHOICES, MIN_LEVELS
from spinf.protocol.names import casefold_pattern
from spinf.protocol.schema import DATA_URL, DETAILS, MODES
from spinf.protocol.schema import components as request_components
from spinf.settings import Limits

REQUEST_ID = r"^scr_[0-9A-HJKMNP-TV-Z]{26}$"

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


def request_schemas(limits: Limits, model_names: tuple[str, ...]) -> dict:
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


def response_schemas() -> dict:
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


def decision_schemas(model_names: tuple[str, ...]) -> dict:
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
