"""The one schema table of a score request (api spec §4.1–§4.5, §4.10, §4.11): the validator and the document.

Every object, field, type and bound of the body is declared here once, as `spinf.protocol.shapes`. The parser
checks step 11 of §4.12 with it (`check_scoring`, `check_input`: a 400 ``invalid_field`` at the first schema error,
an object's fields in the order below) and the model and endpoint of steps 4 and 5; ``GET /openapi.json`` embeds
`components()` unchanged. Unknown keys are ignored (pack references excepted). ``null`` is accepted only where the
spec gives it a meaning (``messages`` / ``inputs``, ``query_ids``, ``combinations``, ``values``, a query's
``empty_floor`` and ``group``, ``generate``). The schema is shape only: which fields go with which slot, and
everything else that needs the template, is `spinf.protocol.request`'s. So are the top-level keys of `REQUEST`,
checked in §4.12's order, and the pack references of step 10; this table is their documented shape, and
``tests/protocol/test_schema.py`` holds the parser to it, field by field, in both directions.
"""

from __future__ import annotations

from spinf.protocol.queries import MAX_VALUE_CHARS
from spinf.protocol.shapes import (
    SCHEMAS,
    Boolean,
    Const,
    Enum,
    Field,
    Integer,
    ListOf,
    MapOf,
    Named,
    Nullable,
    Number,
    Object,
    Parts,
    String,
    Union,
    named_shapes,
)
from spinf.protocol.templates import TEMPLATE_PATTERN
from spinf.settings import Limits

MAX_ID_CHARS = 128
MAX_SEED = 2**31 - 1
DETAILS = ("low", "auto", "high")
MODES = ("max", "per_category", "micro_layer")
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "m4a", "webm")
TRUSTED = "trusted callers only (§4.11); ignored for others"


def _about(text: str, **more: object) -> dict:
    return {"description": text, **more}


# §4.3: content. Only a text part's payload is checked here; media payloads are the media decoder's.
DATA_URL = r"^data:image/(png|jpeg|jpg|webp|gif);base64,"  # the rest: invalid_media, the media reader's
_DATA_URL = String(elsewhere={"pattern": DATA_URL})
IMAGE_URL = Named(
    "ImageUrl",
    Object(
        (
            Field("url", _DATA_URL, True),
            Field("detail", Enum(DETAILS, doc={"default": "auto"})),
        )
    ),
)
# A frame's own detail is ignored, as the spec says (the video's applies), so its image_url takes any.
_FRAME_IMAGE = Object((Field("url", _DATA_URL, True),), doc=_about("detail: ignored"))
_FRAME = Object(
    (Field("t", Number(0, doc=_about("seconds, not decreasing")), True), Field("image_url", _FRAME_IMAGE, True))
)
CONTENT_PART = Named(
    "ContentPart",
    Parts(
        {
            "text": String(),
            "image_url": IMAGE_URL,
            "input_audio": Object(
                (
                    Field("data", String(doc={"contentEncoding": "base64"}), True),
                    Field("format", Enum(AUDIO_FORMATS), True),
                )
            ),
            "video": Object(
                (
                    Field("frames", ListOf(_FRAME, 1, doc=_about("1 to max_frames")), True),
                    Field("detail", Enum(DETAILS, doc={"default": "low"})),
                )
            ),
        },
        checked=("text",),
    ),
)
PART_TYPES = tuple(CONTENT_PART.shape.payloads)
MESSAGE = Named(
    "Message",
    Object(
        (
            Field("role", String()),
            Field(
                "content",
                Union((String(), ListOf(CONTENT_PART)), expected="a string or a list of content parts"),
                True,
            ),
        )
    ),
)

# §4.5: queries. The bounds marked elsewhere are §4.7's and §4.8's, checked per query with their own codes.
GENERATE = Named(
    "Generate",
    Object(
        (
            Field("temperature", Number(0, 2, doc={"default": 0})),
            Field("top_p", Number(0, 1, above_lo=True, doc={"default": 1})),
            Field("top_k", Integer(1, 100, doc=_about("default 40 when temperature > 0, else 1"))),
            Field("seed", Integer(0, MAX_SEED, doc={"default": 0})),
            Field("n", Integer(1, 6, doc={"default": 1})),
        )
    ),
)
_COMBINATIONS = Union(
    (ListOf(MapOf(String(elsewhere={"maxLength": MAX_VALUE_CHARS})), elsewhere={"minItems": 1}), Const("all")),
    expected='a list of value maps, "all" or null',
)
_VALUES = MapOf(
    ListOf(String()),
    # Its bounds hold only with "all" (§4.7), so they are in words: JSON Schema would apply them always.
    doc=_about(f'only with combinations "all": then each list non-empty, each value at most {MAX_VALUE_CHARS} chars'),
)
QUERY = Named(
    "Query",
    Object(
        (
            Field("id", String(max_chars=MAX_ID_CHARS), True),
            Field(
                "template",
                String(
                    elsewhere={"pattern": TEMPLATE_PATTERN},  # invalid_template, step 13
                    doc=_about("§4.6: literal text, up to 5 distinct {name} placeholders and one slot"),
                ),
                True,
            ),
            Field(
                "options",
                ListOf(
                    String(elsewhere={"minLength": 1}),
                    elsewhere={"minItems": 1},
                    doc=_about("required on {?} queries; forbidden on extraction slots"),
                ),
            ),
            Field("combinations", Nullable(_COMBINATIONS)),
            Field("values", Nullable(_VALUES)),
            Field("empty_floor", Nullable(Boolean(doc=_about("null: scoring.empty_floor")))),
            Field("group", Nullable(String(max_chars=MAX_ID_CHARS))),
            Field(
                "max_tokens", Integer(1, 100, doc=_about("extraction only; above 64 only with generate", default=16))
            ),
            Field("top_k", Integer(1, 20, doc=_about("searched extraction only", default=5))),
            Field(
                "calibration",
                Object((Field("a", Number(doc={"default": 1})), Field("b", Number(doc={"default": 0})))),
            ),
            Field(
                "generate",
                Nullable(
                    Union((Boolean(), GENERATE), expected="true, false, null or an object"),
                    doc=_about("{*} slots only"),
                ),
            ),
        )
    ),
)

# §4.10: a pack reference; `spinf.packs.calls` checks it at step 10, its keys and types first, the rest once the pack
# is known (the mode's and categories' rules need it).
_PACK = Object(
    (
        Field("id", String(min_chars=1), True),
        Field("version", String()),
        Field("context", String()),
        Field(
            "decision",
            Object(
                (
                    Field("mode", Enum(MODES)),
                    Field("threshold", Nullable(Number())),
                    Field("thresholds", Nullable(MapOf(Nullable(Number(0, 1))))),
                    Field("critical", Nullable(ListOf(String()))),
                ),
                closed=True,
            ),
        ),
        Field("include_queries", Boolean()),
    ),
    closed=True,
)
PACK_KEYS = _PACK.keys()

# §4.4 and §4.2. The order of the fields is the order of the checks (the first error is the one reported).
SCORING = Named(
    "Scoring",
    Object(
        (
            Field("empty_floor", Boolean(doc={"default": True})),
            Field("case_insensitive", Boolean(doc={"default": True})),
            Field("queries", ListOf(QUERY)),
            Field("packs", ListOf(Named("Pack", _PACK)), checked=False),
        )
    ),
)
INPUT = Named(
    "Input",
    Object(
        (
            Field("id", String(max_chars=MAX_ID_CHARS), True),
            Field("messages", ListOf(MESSAGE), True),
            Field("query_ids", Nullable(ListOf(String(), doc=_about("null: all shared queries")))),
            Field("queries", ListOf(QUERY)),
            Field(
                "parameters",
                MapOf(
                    Union((String(), Number(), Boolean()), expected="a string, a number or a boolean"),
                    doc=_about("pack context parameters"),
                ),
            ),
        )
    ),
)

# §4.1 and §4.11: the top level, checked by the parser in §4.12's order.
MODEL = String(min_chars=1, doc=_about("a name of the served model, matched case-insensitively"))
ENDPOINT = String(min_chars=1, max_chars=MAX_ID_CHARS)
# §4.11: each an integer > 0, except max_extractions_per_input >= 0 (the settings' own rules, spinf.settings), or
# the same number as a string of ASCII digits, as the reference coerces it (at most the 4,300 digits Python reads).
# The parser checks these itself.
# `$(?!\n)`: Python's `$` also matches before a final newline, which the parser does not take.
_DIGITS = {0: r"^[0-9]+$(?!\n)", 1: r"^0*[1-9][0-9]*$(?!\n)"}
_MAX_DIGITS = 4300
_LIMITS = Object(
    tuple(
        Field(
            key,
            Union(
                (Integer(lo), String(elsewhere={"pattern": _DIGITS[lo], "maxLength": _MAX_DIGITS})),
                expected="an integer",
            ),
        )
        for key, lo in ((key, 0 if key == "max_extractions_per_input" else 1) for key in Limits.keys())
    ),
    doc=_about(TRUSTED + "; another key is ignored with an ignored_field warning (§5.6)"),
)
_FEATURES = Object(
    (Field("media", ListOf(String())), Field("extraction", Boolean()), Field("generation", Boolean())),
    doc=_about(TRUSTED + "; another key is ignored with an ignored_field warning (§5.6)"),
)
# Exactly one of messages and inputs is present and not null (step 2).
_ONE_FORM = [{"required": [key], "properties": {key: {"not": {"type": "null"}}}} for key in ("messages", "inputs")]
REQUEST = Named(
    "ScoreRequest",
    Object(
        (
            Field("messages", Nullable(ListOf(MESSAGE), doc=_about("the same as inputs: [{id: '0', messages}]"))),
            Field("inputs", Nullable(ListOf(INPUT, 1))),
            Field("model", MODEL),
            Field("scoring", SCORING),
            Field("endpoint", ENDPOINT),
            Field("limits", _LIMITS),
            Field("features", _FEATURES),
        ),
        elsewhere={"oneOf": _ONE_FORM},
        doc=_about("exactly one of messages and inputs (null counts as absent); other top-level keys are ignored"),
    ),
)


def components() -> dict[str, dict]:
    """The request's schemas for the OpenAPI document, each once; ``ChatRequest`` adds the chat route's rule (§6)."""
    schemas = {name: shape.shape.json_schema() for name, shape in named_shapes(REQUEST).items()}
    chat = {"allOf": [{"$ref": SCHEMAS + REQUEST.name}], "required": ["scoring"], "description": "§6"}
    return {**schemas, "ChatRequest": chat}


def check_scoring(scoring: dict) -> None:
    """The schema of the ``scoring`` object (packs excepted: step 10 checked them)."""
    SCORING.check(scoring, "scoring")


def check_input(raw: object, path: str) -> None:
    """The schema of one input object at ``path`` (``inputs.<i>``)."""
    INPUT.check(raw, path)
