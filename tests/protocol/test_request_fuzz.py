"""Random bodies only ever fail as an `ApiError` of the spec's table (§2.5) with a param that points into the body,
never with another exception; and the parser refuses every body the served OpenAPI document refuses.

Arbitrary JSON rarely gets past the first checks, so most bodies are built from the request's real keys with
values that are sometimes right and sometimes any JSON; the engine's token-free checks then run on what parses.
The budgets are fixed and the examples derandomized (`FIXED`), so a run in CI is fast and the same every time.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from spinf.errors import ApiError
from spinf.protocol.request import decode_json_body
from spinf.server.openapi import ERROR_CODES
from spinf.settings import Features, Limits
from spinf.settings.kinds import MEDIA_KINDS
from tests.protocol.bodies import FIXED, refusal
from tests.protocol.document import COMPONENTS, SCORE_REQUEST

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 300)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


def mostly(good: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` about nine times in ten, else any JSON value (`st.one_of` would merge repeated branches)."""
    return st.integers(0, 9).flatmap(lambda k: json_values if k == 9 else good)


def obj(*required: str, **fields: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly an object with the ``required`` keys and some of the others, each value mostly of the right type."""
    must = {key: mostly(fields.pop(key)) for key in required}
    return mostly(st.fixed_dictionaries(must, optional={key: mostly(value) for key, value in fields.items()}))


names = st.sampled_from(["a", "b", "n", "x"])
templates = st.sampled_from(
    ["{?}", "Q {a}:{?}", "{a}{b}{?}", '"{*}"', "{n}", "{a} {$}", "{?} x", "{{?}}", "{a-}{?}", "}"]
)
short_text = st.text(alphabet="aB {}?*$n\n", max_size=5)
queries = obj(
    "id",
    "template",
    id=st.sampled_from(["q1", "q2", "q3"]),
    template=templates,
    options=st.lists(short_text, max_size=4),
    combinations=st.just("all") | st.lists(st.dictionaries(names, short_text, max_size=3), max_size=3),
    values=st.dictionaries(names, st.lists(short_text, max_size=3), max_size=3),
    empty_floor=st.booleans(),
    max_tokens=st.integers(0, 101),
    top_k=st.integers(0, 21),
    calibration=obj(a=st.floats(-2, 2), b=st.floats(-2, 2)),
    generate=st.booleans() | obj(temperature=st.floats(0, 2), n=st.integers(0, 7), top_k=st.integers(1, 100)),
)
parts = obj(
    "type",
    type=st.sampled_from(["text", "image_url", "input_audio", "video", "file"]),
    text=short_text,
    image_url=obj(url=st.text(max_size=3)),
    input_audio=obj(data=st.text(max_size=3)),
    video=obj(frames=st.lists(json_values, max_size=2)),
)
messages = st.lists(obj("content", role=st.just("user"), content=short_text | st.lists(parts, max_size=3)), max_size=3)
inputs = obj(
    "id",
    "messages",
    id=st.sampled_from(["0", "1"]),
    messages=messages,
    query_ids=st.none() | st.lists(st.sampled_from(["q1", "q2", "zz"]), max_size=3),
    queries=st.lists(queries, max_size=2),
    parameters=st.dictionaries(st.text(max_size=2), scalars, max_size=2),
)
bodies = st.one_of(
    json_values,
    *(
        obj(
            form,
            "scoring",
            **{form: strategy},
            model=st.sampled_from(["spinf-12b", "SPINF-12B", "SPINF-12b", "other"]),
            endpoint=st.text(min_size=1, max_size=3),
            scoring=obj(
                "queries",
                queries=st.lists(queries, min_size=1, max_size=3),
                empty_floor=st.booleans(),
                case_insensitive=st.booleans(),
                packs=st.lists(obj(id=st.text(max_size=2), version=st.text(max_size=2)), max_size=2),
            ),
            limits=st.dictionaries(st.sampled_from([*Limits.keys(), "bogus"]), st.integers(-1, 5), max_size=3),
            features=obj(media=st.lists(st.sampled_from([*MEDIA_KINDS, "smell"])), extraction=st.booleans()),
        )
        for form, strategy in (("messages", messages), ("inputs", st.lists(inputs, min_size=1, max_size=3)))
    ),
)
media_sets = st.frozensets(st.sampled_from(MEDIA_KINDS))


def _property_names(schema: object) -> set[str]:
    if isinstance(schema, list):
        return set().union(*map(_property_names, schema))
    if not isinstance(schema, dict):
        return set()
    return set(schema.get("properties", {})).union(*map(_property_names, schema.values()))


DECLARED_KEYS = _property_names(COMPONENTS)


def points_into(param: str, body: object) -> bool:
    """Whether ``param`` is a dotted path into ``body``: each step an index or a key it has (a key may hold dots),
    or, last, a key the document declares and the body lacks (a missing field). ``body`` is the body itself when it
    is not an object, and in the messages form ``inputs.0`` is the whole body (§4.1)."""
    if param == "body":
        return not isinstance(body, dict)
    steps = param.split(".")
    if isinstance(body, dict) and body.get("messages") is not None and steps[:2] == ["inputs", "0"]:
        steps = steps[2:]
    return _resolves(body, steps)


def _resolves(node: object, steps: list[str]) -> bool:
    if not steps:
        return True
    if isinstance(node, list):
        return steps[0].isdigit() and int(steps[0]) < len(node) and _resolves(node[int(steps[0])], steps[1:])
    if node == "all":  # §4.7: under "all", <q>.combinations.<j>.<name> counts the combinations it produces
        return len(steps) == 2 and steps[0].isdigit()
    if not isinstance(node, dict):
        return False
    for n in range(1, len(steps) + 1):
        key = ".".join(steps[:n])
        if key in node and _resolves(node[key], steps[n:]):
            return True
    return len(steps) == 1 and steps[0] in DECLARED_KEYS


@settings(FIXED, max_examples=600)
@given(
    body=bodies,
    chat=st.booleans(),
    trusted=st.booleans(),
    model_media=media_sets,
    features=st.builds(Features, media=media_sets, extraction=st.booleans(), generation=st.booleans()),
)
def test_random_bodies_fail_only_with_spec_codes(body, chat, trusted, model_media, features):
    options = {"served_names": ["spinf-12b"], "model_media": model_media, "features": features, "trusted": trusted}
    error = refusal(body, chat=chat, **options)
    if error is not None:
        assert error.code in ERROR_CODES.get(error.status, ()), error
        assert error.param is None or points_into(error.param, body), error


# The §4.5 slot rules (which fields go with which slot) and §4.7's value bound under "all": the invalid_field
# refusals the document cannot state as a schema, so the only ones a body it accepts may get.
SLOT_RULES = re.compile(r"^(scoring|inputs\.\d+)\.queries\.\d+(\.options|\.generate|\.combinations\.\d+\.[^.]+)?$")


@settings(FIXED, max_examples=400)
@given(body=bodies, features=st.builds(Features, extraction=st.booleans(), generation=st.booleans()))
def test_random_bodies_the_document_refuses_are_refused(body, features):
    error = refusal(body, served_names=["spinf-12b"], features=features, trusted=True)
    if not SCORE_REQUEST.is_valid(body):
        assert error is not None
    elif error is not None and error.code == "invalid_field":
        assert SLOT_RULES.match(error.param), error


@settings(FIXED, max_examples=200)
@given(raw=st.binary(max_size=40) | json_values.map(lambda v: repr(v).encode()))
def test_random_bytes_decode_or_fail_as_invalid_json(raw):
    try:
        decode_json_body(raw)
    except ApiError as e:
        assert (e.status, e.code, e.param) == (400, "invalid_json", None)
