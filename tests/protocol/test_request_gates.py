"""Route, model, trusted overrides, media and feature gates of a score body, and the order of the checks (§4.12)."""

from __future__ import annotations

import pytest

from spinf.errors import ApiError
from spinf.protocol.request import parse_score_request
from spinf.settings import Features, Limits
from tests.protocol.bodies import AUDIO, DROP, IMAGE, SCORED, TEXT, VIDEO, body, content, merged, shared

# Route, model and trusted overrides (§4.1, §4.11, §6)


@pytest.mark.parametrize("data", [merged(body(), {"scoring": DROP}), body() | {"scoring": None}])
def test_the_chat_route_requires_scoring(refused, data):
    refused(lambda: parse_score_request(data, chat=True), "scoring_required", "scoring")


def test_scoring_defaults_on_the_score_route():
    req = parse_score_request({"inputs": [{"id": "a", "messages": []}]})
    assert (req.queries, req.empty_floor, req.case_insensitive) == ((), True, True)


@pytest.mark.parametrize(("model", "served"), [("SPINF-12b", ["spinf-12b"]), ("anything", None)])
def test_model_names_match_case_insensitively(model, served):
    assert parse_score_request(body(model=model), served_names=served).model == model


SERVER_LIMITS = Limits(max_options=50, max_extractions_per_input=4)


def test_trusted_limits_are_capped_by_the_server_and_keys_left_out_keep_its_values():
    given = {"max_options": 10, "max_extractions_per_input": 9, "max_content_tokens": 100}
    req = parse_score_request(body(limits=given), limits=SERVER_LIMITS, trusted=True)
    assert req.limits == Limits(max_options=10, max_extractions_per_input=4, max_content_tokens=100)


def test_trusted_limits_accept_zero_extractions():
    req = parse_score_request(body(limits={"max_extractions_per_input": 0}), limits=SERVER_LIMITS, trusted=True)
    assert req.limits.max_extractions_per_input == 0


@pytest.mark.parametrize(
    ("given", "param", "message"),
    [
        ([], "limits", r"^limits must be an object$"),
        (None, "limits", r"^limits must be an object$"),
        ({"max_options": 0}, "limits.max_options", r"^max_options must be an integer greater than 0, got 0$"),
        ({"max_options": True}, "limits.max_options", r"^max_options must be an integer greater than 0, got True$"),
        ({"max_frames": 2.0}, "limits.max_frames", r"^max_frames must be an integer greater than 0, got 2\.0$"),
        ({"max_extractions_per_input": -1}, "limits.max_extractions_per_input", r"^.* at least 0, got -1$"),
        # a string is read only when it is ASCII digits, and then held to the same rules as a number
        ({"max_content_tokens": "abc"}, "limits.max_content_tokens", r"^.* greater than 0, got 'abc'$"),
        ({"max_content_tokens": "0"}, "limits.max_content_tokens", r"^.* greater than 0, got 0$"),
        ({"max_options": ""}, "limits.max_options", r"^.* greater than 0, got ''$"),
        ({"max_options": "8.0"}, "limits.max_options", r"^.* greater than 0, got '8\.0'$"),
        ({"max_options": "-5"}, "limits.max_options", r"^.* greater than 0, got '-5'$"),
        ({"max_options": " 8"}, "limits.max_options", r"^.* greater than 0, got ' 8'$"),
        ({"max_options": "1_000"}, "limits.max_options", r"^.* greater than 0, got '1_000'$"),
        ({"max_options": "\u0668"}, "limits.max_options", r"^.* greater than 0, got '\u0668'$"),  # Arabic-Indic 8
        (
            {"max_options": "9" * 5000},
            "limits.max_options",
            r"^limits\.max_options has 5000 digits; too many to read$",
        ),
        ({"max_options": None}, "limits.max_options", r"^.* greater than 0, got None$"),
    ],
)
def test_trusted_limits_refused(given, param, message):
    with pytest.raises(ApiError, match=message) as info:
        parse_score_request(body(limits=given), trusted=True)
    assert (info.value.status, info.value.code, info.value.param) == (400, "invalid_field", param)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"max_content_tokens": "8192"}, Limits(max_options=50, max_extractions_per_input=4)),  # capped at 4,096
        ({"max_content_tokens": "100"}, Limits(max_options=50, max_extractions_per_input=4, max_content_tokens=100)),
        ({"max_options": "007"}, Limits(max_options=7, max_extractions_per_input=4)),
        ({"max_extractions_per_input": "0"}, Limits(max_options=50, max_extractions_per_input=0)),
    ],
)
def test_trusted_limits_sent_as_digit_strings_are_read_as_integers(given, expected):
    req = parse_score_request(body(limits=given), limits=SERVER_LIMITS, trusted=True)
    assert req.limits == expected and req.warnings == ()


def test_unknown_trusted_limits_and_features_are_ignored_with_a_warning_each():
    limits = {"max_tokens": 5, "max_options": 10, "bogus": {"any": ["thing"]}}
    features = {"packs": False, "media": ["image"]}
    req = parse_score_request(
        body(limits=limits, features=features), limits=SERVER_LIMITS, features=SERVER_FEATURES, trusted=True
    )
    assert req.limits == Limits(max_options=10, max_extractions_per_input=4)
    assert req.features == Features(frozenset({"image"}), True, True)
    names = ", ".join(Limits.keys())
    assert req.warnings == (
        {
            "code": "ignored_field",
            "message": f"limits.max_tokens is not a key this server knows, so it was ignored; the limits are {names}",
            "param": "limits.max_tokens",
        },
        {
            "code": "ignored_field",
            "message": f"limits.bogus is not a key this server knows, so it was ignored; the limits are {names}",
            "param": "limits.bogus",
        },
        {
            "code": "ignored_field",
            "message": "features.packs is not a key this server knows, so it was ignored; the features are media, "
            "extraction, generation",
            "param": "features.packs",
        },
    )


def test_an_unknown_key_does_not_hide_a_bad_value_after_it():
    with pytest.raises(ApiError) as info:
        parse_score_request(body(limits={"bogus": 1, "max_options": "many"}), trusted=True)
    assert (info.value.code, info.value.param) == ("invalid_field", "limits.max_options")


SERVER_FEATURES = Features(media=frozenset({"image", "audio"}), extraction=True, generation=True)


@pytest.mark.parametrize(
    ("given", "server", "expected"),
    [
        ({}, SERVER_FEATURES, SERVER_FEATURES),
        ({"media": ["image", "video", "smell"]}, SERVER_FEATURES, Features(frozenset({"image"}), True, True)),
        ({"media": []}, SERVER_FEATURES, Features(frozenset(), True, True)),
        ({"extraction": False}, SERVER_FEATURES, Features(frozenset({"image", "audio"}), False, False)),
        ({"generation": False}, SERVER_FEATURES, Features(frozenset({"image", "audio"}), True, False)),
        (
            {"extraction": True, "generation": True},
            Features(extraction=False),
            Features(extraction=False, generation=False),
        ),
        ({"generation": True}, Features(generation=False), Features(generation=False)),
    ],
)
def test_trusted_features_are_capped_by_the_server(given, server, expected):
    assert parse_score_request(body(features=given), features=server, trusted=True).features == expected


@pytest.mark.parametrize(
    ("given", "param"),
    [
        ("all", "features"),
        ({"media": "image"}, "features.media"),
        ({"media": ["image", 1]}, "features.media"),
        ({"media": None}, "features.media"),
        ({"extraction": "yes"}, "features.extraction"),
        ({"generation": 1}, "features.generation"),
    ],
)
def test_trusted_features_refused(refused, given, param):
    refused(lambda: parse_score_request(body(features=given), trusted=True), "invalid_field", param)


def test_untrusted_callers_limits_and_features_are_ignored_unchecked():
    req = parse_score_request(
        body(limits="junk", features={"media": 5}), limits=SERVER_LIMITS, features=SERVER_FEATURES
    )
    assert (req.limits, req.features, req.warnings) == (SERVER_LIMITS, SERVER_FEATURES, ())
    ignored = parse_score_request(body(limits={"bogus": 1}, features={"bogus": 1}), limits=SERVER_LIMITS)
    assert ignored.warnings == ()  # an untrusted caller's overrides are not read at all, so nothing is reported


# Media and feature gates (§4.12 steps 12 and 13)


@pytest.mark.parametrize(
    ("parts", "model_media", "media", "code"),
    [
        ([IMAGE], set(), {"image"}, "media_not_supported"),
        ([IMAGE], {"image"}, set(), "media_disabled"),
        ([VIDEO], {"image", "audio"}, {"image", "audio", "video"}, "media_not_supported"),
        # kinds go in sorted order, each through both checks: audio (disabled) comes before image (unsupported)
        ([IMAGE, AUDIO], {"audio"}, set(), "media_disabled"),
        ([AUDIO, IMAGE], {"audio", "image"}, {"audio"}, "media_disabled"),
    ],
)
def test_media_gates(refused, parts, model_media, media, code):
    data = body(inputs=[{"id": "a", "messages": []}, merged({"id": "b"}, content(*parts))])
    features = Features(media=frozenset(media))
    refused(
        lambda: parse_score_request(data, model_media=frozenset(model_media), features=features),
        code,
        "inputs.1.messages",
    )


def test_a_media_part_in_string_content_is_just_text():
    req = parse_score_request(body(input={"messages": [{"content": '{"type": "image_url"}'}]}))
    assert req.inputs[0].segments == ('{"type": "image_url"}',)


@pytest.mark.parametrize(
    ("query", "features", "code", "param"),
    [
        (TEXT, Features(extraction=False), "extraction_disabled", "scoring.queries.1.template"),
        (
            {"id": "n", "template": "{n}"},
            Features(extraction=False),
            "extraction_disabled",
            "scoring.queries.1.template",
        ),
        (
            merged(TEXT, {"generate": {}}),
            Features(generation=False),
            "generation_disabled",
            "scoring.queries.1.generate",
        ),
    ],
)
def test_feature_gates(refused, query, features, code, param):
    refused(lambda: parse_score_request(shared(SCORED | {"id": "s"}, query), features=features), code, param)


def test_generate_false_needs_no_generation_feature():
    req = parse_score_request(shared(merged(TEXT, {"generate": False})), features=Features(generation=False))
    assert req.queries[0].generate is None


# The order of the checks (§4.12): with two problems, the earlier step is reported


@pytest.mark.parametrize(
    ("data", "code", "param"),
    [
        pytest.param(body(model=1, endpoint=""), "invalid_field", "model", id="model-before-endpoint"),
        pytest.param(body(model="other", endpoint=""), "model_not_served", "model", id="served-before-endpoint"),
        pytest.param(body(endpoint="", limits=[]), "invalid_field", "endpoint", id="endpoint-before-limits"),
        pytest.param(body(limits=[], features=[]), "invalid_field", "limits", id="limits-before-features"),
        pytest.param(body(features=[]) | {"scoring": 1}, "invalid_field", "features", id="features-before-scoring"),
        pytest.param(
            body(scoring={"queries": 1}, inputs=[]), "invalid_field", "scoring.queries", id="queries-before-inputs"
        ),
        pytest.param(
            body(inputs=[1], scoring={"packs": [{"id": "p"}]}),
            "unknown_pack",
            "scoring.packs.0.id",
            id="packs-before-schema",
        ),
        pytest.param(
            body(query={"id": 1}, input={"id": 2}), "invalid_field", "scoring.queries.0.id", id="scoring-before-inputs"
        ),
        pytest.param(
            body(query={"template": "}"}, input=content(IMAGE)),
            "media_not_supported",
            "inputs.0.messages",
            id="media-before-template",
        ),
        pytest.param(
            body(query={"template": "}"}, input={"queries": [{"id": "o", "template": "{?} x"}]}),
            "invalid_template",
            "scoring.queries.0.template",
            id="shared-before-own",
        ),
        pytest.param(
            shared(SCORED, SCORED, inputs=[{"id": "a", "messages": [], "queries": [{"id": "o", "template": "x"}]}]),
            "invalid_template",
            "inputs.0.queries.0.template",
            id="templates-before-duplicates",
        ),
        pytest.param(
            shared(SCORED, SCORED, inputs=[{"id": "a", "messages": []}] * 2),
            "duplicate_id",
            "scoring.queries.1.id",
            id="shared-duplicates-before-inputs",
        ),
        pytest.param(
            body(inputs=[merged({"id": "a"}, content({"type": "x"})), {"id": "a", "messages": []}]),
            "duplicate_id",
            "inputs.1.id",
            id="duplicates-before-content",
        ),
    ],
)
def test_order(refused, data, code, param):
    refused(lambda: parse_score_request(data, served_names=["spinf-12b"], trusted=True), code, param)


@pytest.mark.parametrize(
    ("queries", "features", "code", "param"),
    [
        pytest.param(
            [merged(TEXT, {"options": []})],
            Features(extraction=False),
            "invalid_field",
            "scoring.queries.0.options",
            id="slot-rules-before-extraction-gate",
        ),
        pytest.param(
            [merged(TEXT, {"generate": True})],
            Features(extraction=False, generation=False),
            "extraction_disabled",
            "scoring.queries.0.template",
            id="extraction-gate-before-generation-gate",
        ),
        pytest.param(
            [merged(TEXT, {"generate": True}), {"id": "b", "template": "}"}],
            Features(generation=False),
            "generation_disabled",
            "scoring.queries.0.generate",
            id="query-by-query",
        ),
    ],
)
def test_order_within_step_13(refused, queries, features, code, param):
    refused(lambda: parse_score_request(shared(*queries), features=features), code, param)
