"""Random bodies only ever fail as a 400 `ApiError` with a code of the spec's table (§2.5), never another exception.

Arbitrary JSON rarely gets past the first checks, so most bodies are built from the request's real keys with
values that are sometimes right and sometimes any JSON; the engine's token-free checks then run on what parses.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spinf.errors import ApiError
from spinf.protocol.queries import check_options, choose_queries, expand_combinations
from spinf.protocol.request import decode_json_body, parse_score_request
from spinf.settings import MEDIA_KINDS, Features, Limits

# Every 400 code of api spec §2.5.
SPEC_400_CODES = frozenset(
    """invalid_json invalid_field scoring_required model_not_served media_not_supported media_disabled
    extraction_disabled generation_disabled invalid_template missing_value unknown_placeholder too_many_combinations
    too_many_options duplicate_option option_too_long option_boundary template_too_long duplicate_id unknown_query_id
    empty_queries too_many_extractions too_many_prompts content_too_long unsupported_content invalid_media
    audio_too_long image_too_large unknown_pack unknown_pack_version pack_not_available pack_conflict reserved_group
    unknown_category pack_media_not_supported""".split()
)

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


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=bodies,
    chat=st.booleans(),
    trusted=st.booleans(),
    model_media=media_sets,
    features=st.builds(Features, media=media_sets, extraction=st.booleans(), generation=st.booleans()),
)
def test_random_bodies_fail_only_with_spec_codes(body, chat, trusted, model_media, features):
    try:
        request = parse_score_request(
            body, chat=chat, served_names=["spinf-12b"], model_media=model_media, features=features, trusted=trusted
        )
        for i in range(len(request.inputs)):
            for q in choose_queries(request, i):
                expand_combinations(q)
                if q.is_scored:
                    check_options(q, case_insensitive=request.case_insensitive, max_options=request.limits.max_options)
    except ApiError as e:
        assert (e.status, e.code in SPEC_400_CODES) == (400, True), e
        assert e.param is None or isinstance(e.param, str)


@given(raw=st.binary(max_size=40) | json_values.map(lambda v: repr(v).encode()))
def test_random_bytes_decode_or_fail_as_invalid_json(raw):
    try:
        decode_json_body(raw)
    except ApiError as e:
        assert (e.status, e.code, e.param) == (400, "invalid_json", None)
