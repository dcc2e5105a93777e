"""The decisions mapping (`spinf.decisions`) without an engine: the SDK's body checked at its limits, the input and
the questions written out as a score body in the default prompt style, score refusals put back on the SDK's params,
and a score response turned into the SDK's ``Decision``."""

from __future__ import annotations

import math

import pytest
from openai.types import Decision

from spinf.decisions import DEFAULT_STYLE, plan_decisions, style_for
from spinf.errors import ApiError


def body(*questions: dict, input: object = "I was charged twice.", **extra) -> dict:  # noqa: A002 - the SDK's name
    return {"model": "tiny", "input": input, "questions": list(questions), **extra}


PREDICATE = {"type": "predicate", "instructions": "The customer asks for a refund.", "name": "refund"}


def choice(*values, **extra) -> dict:
    return {"type": "choice", "instructions": "Which?", "choices": [{"value": v} for v in values], **extra}


def score(*labels) -> dict:
    return {"type": "score", "instructions": "How angry?", "levels": [{"label": label} for label in labels]}


def refused(payload: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        plan_decisions(payload)
    assert caught.value.status == 400
    return caught.value


def queries(payload: dict) -> list[dict]:
    return plan_decisions(payload).score_body()["scoring"]["queries"]


# the score body


def test_a_string_input_is_the_content_and_the_floor_and_case_variants_are_off():
    scored = plan_decisions(body(PREDICATE, input="Refund me.  \n")).score_body()
    assert scored["model"] == "tiny"
    assert scored["messages"] == [{"role": "user", "content": "Refund me."}]  # trailing whitespace dropped
    assert scored["scoring"]["empty_floor"] is False and scored["scoring"]["case_insensitive"] is False


def test_messages_and_tool_items_are_rendered_as_text_with_their_roles():
    items = [
        {"role": "system", "content": "Support inbox."},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Order "}, {"type": "input_json",
                                                                              "data": {"id": 7, "ok": True}}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"id": 7}', "namespace": "shop"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "shipped"}]},
        {"type": "custom_tool_call", "call_id": "c2", "name": "grep", "input": "refund"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "2 hits"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sorry."},
                                          {"type": "refusal", "refusal": " No."}]},
    ]  # fmt: skip
    content = plan_decisions(body(PREDICATE, input=items)).score_body()["messages"][0]["content"]
    assert content == (
        'System: Support inbox.\n\nDeveloper: Be brief.\n\nUser: Order {"id":7,"ok":true}\n\n'
        'Function call shop.lookup: {"id": 7}\n\nFunction output (shop.lookup): shipped\n\n'
        "Tool call grep: refund\n\nTool output (grep): 2 hits\n\nAssistant: Sorry. No."
    )


def test_each_question_is_one_scored_query_in_question_order():
    found = queries(body(PREDICATE, choice("billing", "shipping"), score("calm", "angry")))
    assert [q["id"] for q in found] == ["0", "1", "2"]
    assert found[0] == {
        "id": "0",
        "template": "\n\nStatement: The customer asks for a refund.\nIs the statement true of the input above? "
        "Answer true or false.\nAnswer:{?}",
        "options": [" true", " false"],
    }
    assert found[1]["template"] == "\n\nQuestion: Which?\nAnswer:{?}"  # no description: no listing
    assert found[1]["options"] == [" billing", " shipping"]
    assert found[2]["template"] == (
        "\n\nQuestion: How angry?\nLevels, from lowest to highest:\n- calm\n- angry\n"
        "Answer with one level.\nAnswer:{?}"
    )
    assert found[2]["options"] == [" calm", " angry"]


def test_descriptions_list_the_choices_and_braces_are_literal():
    question = {"type": "choice", "instructions": [{"type": "input_text", "text": "Topic of {this}? "},
                                                   {"type": "input_json", "data": {"k": [1]}}],
                "choices": [{"value": "billing", "description": "money {back}"}, {"value": True}]}  # fmt: skip
    (found,) = queries(body(question))
    assert found["template"] == (
        '\n\nQuestion: Topic of {{this}}? {{"k":[1]}}\nChoices:\n- billing: money {{back}}\n- true\n'
        "Answer with one choice.\nAnswer:{?}"
    )


def test_a_string_and_a_boolean_with_the_same_text_are_two_options():
    (found,) = queries(body(choice("true", True, "false", False, '"quoted"', "True")))
    assert found["options"] == [' "true"', " true", ' "false"', " false", ' "\\"quoted\\""', " True"]
    assert len(set(found["options"])) == 6


def test_the_style_is_looked_up_by_the_manifest_name():
    assert style_for("default") is DEFAULT_STYLE
    with pytest.raises(ApiError) as caught:
        plan_decisions(body(PREDICATE), prompt_style="decider")
    assert (caught.value.code, caught.value.param) == ("model_not_served", "model")


# the SDK's limits and shapes


def test_1_to_400_questions():
    assert len(queries(body(*[PREDICATE] * 400))) == 400
    for count in (0, 401):
        exc = refused(body(*[PREDICATE] * count))
        assert (exc.code, exc.param) == ("invalid_field", "questions")


def test_2_to_255_choices_and_levels():
    assert len(queries(body(choice(*[f"v{j}" for j in range(255)])))[0]["options"]) == 255
    for count in (1, 256):
        exc = refused(body(PREDICATE, choice(*[f"v{j}" for j in range(count)])))
        assert (exc.code, exc.param) == ("too_many_options", "questions.1.choices")
    exc = refused(body(score("only")))
    assert (exc.code, exc.param) == ("too_many_options", "questions.0.levels")


def test_repeated_choices_and_levels_are_refused_at_the_later_one():
    exc = refused(body(choice("a", "b", "a")))
    assert (exc.code, exc.param) == ("duplicate_option", "questions.0.choices.2")
    assert refused(body(score("low", "low"))).param == "questions.0.levels.1"
    assert len(queries(body(choice("1", True, "a")))[0]["options"]) == 3  # typed: no clash


@pytest.mark.parametrize(
    ("payload", "code", "param"),
    [
        ([], "invalid_field", "body"),
        ({"input": "x", "questions": [PREDICATE]}, "invalid_field", "model"),
        (body(PREDICATE, input=[]), "invalid_field", "input"),
        (body(PREDICATE, input=5), "invalid_field", "input"),
        (body(PREDICATE, input=[{"role": "tool", "content": "x"}]), "invalid_field", "input.0.role"),
        (body(PREDICATE, input=[{"type": "reasoning"}]), "invalid_field", "input.0.type"),
        (body(PREDICATE, input=[{"type": {}, "call_id": "c"}]), "invalid_field", "input.0.type"),  # unhashable
        (body(PREDICATE, input=[{"type": "function_call_output", "call_id": "c9", "output": "x"}]),
         "invalid_field", "input.0.call_id"),
        (body(PREDICATE, input=[{"role": "system", "content": [{"type": "input_json", "data": {}}]}]),
         "unsupported_content", "input.0.content.0"),
        (body(PREDICATE, input=[{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]),
         "media_not_supported", "input.0.content.0.file_id"),
        (body(PREDICATE, input=[{"role": "user", "content": [{"type": "input_image", "image_url": 3}]}]),
         "invalid_field", "input.0.content.0.image_url"),
        (body(PREDICATE, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:,",
                                                               "detail": 1}]}]),
         "invalid_field", "input.0.content.0.detail"),
        (body(PREDICATE, input=[{"role": "system", "content": [{"type": "input_image", "image_url": "data:,"}]}]),
         "unsupported_content", "input.0.content.0"),
        (body({**PREDICATE, "instructions": [{"type": "input_image", "image_url": "https://x/y.png"}]}),
         "media_not_supported", "questions.0.instructions.0"),
        (body({"type": "rating", "instructions": "x"}), "invalid_field", "questions.0.type"),
        (body({**PREDICATE, "instructions": " "}), "invalid_field", "questions.0.instructions"),
        (body({**PREDICATE, "name": 3}), "invalid_field", "questions.0.name"),
        (body(choice("a", 1)), "invalid_field", "questions.0.choices.1.value"),
        (body(choice("a", "b") | {"choices": [{"value": "a"}, {"value": "b", "description": 2}]}),
         "invalid_field", "questions.0.choices.1.description"),
        (body(score("low", "high") | {"levels": [{"label": "low"}, {"label": True}]}),
         "invalid_field", "questions.0.levels.1.label"),
        (body(PREDICATE, safety_identifier=3), "invalid_field", "safety_identifier"),
    ],
)  # fmt: skip
def test_each_problem_is_a_400_at_its_sdk_path(payload, code, param):
    exc = refused(payload)
    assert (exc.code, exc.param) == (code, param)


def test_input_json_limits():
    def with_data(data) -> dict:
        return body(PREDICATE, input=[{"role": "user", "content": [{"type": "input_json", "data": data}]}])

    deep: dict = {}
    for _ in range(31):
        deep = {"a": deep}
    assert plan_decisions(with_data(deep))  # 32 levels
    assert refused(with_data({"a": deep})).param == "input.0.content.0.data"
    assert plan_decisions(with_data({"v": list(range(9_998))}))  # the object, the list, 9,998 numbers
    assert "10,000 values" in refused(with_data({"v": list(range(9_999))})).message
    assert "256 KiB" in refused(with_data({"v": "x" * (256 * 1024)})).message
    assert refused(with_data([1, 2])).param == "input.0.content.0.data"


def test_the_ignored_keys_are_accepted():
    assert plan_decisions(body(PREDICATE, prompt_cache_key="k", prompt_cache_options={"ttl": "30m"},
                               safety_identifier="u1"))  # fmt: skip


# refusals of the score body, on the SDK's params


@pytest.mark.parametrize(
    ("param", "translated"),
    [
        (None, None),
        ("model", "model"),
        ("inputs.0", "input"),
        ("inputs.0.messages", "input"),
        ("scoring.queries.1.options.1", "questions.1.choices.1"),
        ("scoring.queries.2.options.0", "questions.2.levels.0"),
        ("scoring.queries.0.options.1", "questions.0"),  # a predicate's options are ours
        ("scoring.queries.1.options", "questions.1.choices"),
        ("scoring.queries.1.combinations.0", "questions.1.instructions"),
        ("scoring.queries.2.template", "questions.2.instructions"),
        ("scoring.queries.2", "questions.2"),
        ("scoring.queries.9", None),
    ],
)
def test_score_params_are_translated(param, translated):
    call = plan_decisions(body(PREDICATE, choice("a", "b"), score("low", "high")))
    exc = call.translate(ApiError(400, "option_too_long", param, "too long"))
    assert (exc.status, exc.code, exc.param, exc.message) == (400, "option_too_long", translated, "too long")


# the Decision


def options(*logprobs: float) -> list[dict]:
    total = sum(math.exp(lp) for lp in logprobs)
    return [{"text": "x", "logprob": lp, "p": round(math.exp(lp) / total, 6), "floor_p": None} for lp in logprobs]


def response(*per_question: list[dict]) -> dict:
    queries = [{"id": str(k), "combinations": [{"values": {}, "options": o}]} for k, o in enumerate(per_question)]
    return {
        "id": "scr_01M8SZYWH6ZMMGVMY3YP2HPSJN",
        "model": "TINY",
        "results": [{"input_id": "0", "queries": queries}],
        "usage": {"prompt_tokens": 321},
    }


def test_the_answer_parses_as_the_sdks_decision():
    call = plan_decisions(body(PREDICATE, choice("true", True, "x"), {**score("low", "mid", "high"), "name": "s"}))
    scored = response(options(-1.0, -2.0), options(-3.0, -0.5, -0.5), options(-2.0, -1.0, -0.25))
    answer = call.answer(scored)
    decision = Decision.model_validate(answer)
    assert decision.model == "TINY" and [a.name for a in decision.answers] == ["refund", None, "s"]
    predicate, chosen, scaled = decision.answers
    assert predicate.type == "predicate" and predicate.probability == scored["results"][0]["queries"][0][
        "combinations"][0]["options"][0]["p"]  # fmt: skip
    assert [p.value for p in chosen.probabilities] == ["true", True, "x"]
    assert chosen.choice is True  # the first of two equal logprobs, a boolean and not the string
    assert chosen.confidence == round(math.exp(-0.5), 6)
    weights = [math.exp(-2.0), math.exp(-1.0), math.exp(-0.25)]
    assert scaled.score == round((weights[1] + 2 * weights[2]) / sum(weights), 6)
    assert [(p.label, p.value) for p in scaled.probabilities] == [("low", 0), ("mid", 1), ("high", 2)]
    assert scaled.confidence == round(math.exp(-0.25), 6)
    assert answer["usage"] == {
        "input_tokens": 321,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 321,
    }
    assert answer["answers"][1]["name"] is None and "name" in answer["answers"][1]  # null when unnamed


IMAGE_URL = "data:image/png;base64,iVBORw0KGgo="


def test_images_in_the_input_become_image_url_parts_where_they_stand():
    tool = [
        {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_image", "image_url": IMAGE_URL}, {"type": "input_text", "text": "a receipt "}]},
    ]  # fmt: skip
    message = {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "Look:"},
            {"type": "input_image", "image_url": IMAGE_URL, "detail": "low"},
            {"type": "input_text", "text": " is this a refund?  "},
        ],
    }
    call = plan_decisions(body(PREDICATE, input=[message, *tool]))
    assert call.score_body()["messages"][0]["content"] == [
        {"type": "text", "text": "User: Look:"},
        {"type": "image_url", "image_url": {"url": IMAGE_URL, "detail": "low"}},
        {"type": "text", "text": " is this a refund?  \n\nFunction call look: {}\n\nFunction output (look): "},
        {"type": "image_url", "image_url": {"url": IMAGE_URL, "detail": "auto"}},
        {"type": "text", "text": "a receipt"},  # the content's trailing whitespace dropped
    ]
    assert call.content_params == ("input", "input.0.content.1", "input", "input.2.output.0", "input")
    # the score body's refusals at a part come back at the SDK's part
    for param, expected in [
        ("messages.0.content.1.image_url.url", "input.0.content.1.image_url"),
        ("messages.0.content.3.image_url.detail", "input.2.output.0.detail"),
        ("inputs.0.messages.0.content.3", "input.2.output.0"),  # the score API's param (api spec §4.3)
        ("messages.0.content.2.text", "input"),
    ]:
        assert call.translate(ApiError(400, "invalid_media", param, "x")).param == expected
    # without an image the content stays one text, as before
    plain = plan_decisions(body(PREDICATE, input=[{"role": "user", "content": "Refund me.  "}]))
    assert plain.score_body()["messages"][0]["content"] == "User: Refund me."


def test_an_image_in_a_questions_instructions_is_refused():
    image = {"type": "input_image", "image_url": IMAGE_URL}
    exc = refused(body({**PREDICATE, "instructions": [{"type": "input_text", "text": "Is it a receipt?"}, image]}))
    assert (exc.code, exc.param) == ("media_not_supported", "questions.0.instructions.1")
