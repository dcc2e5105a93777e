"""``POST /v1/decisions`` (D11, docs/decisions.md) with the real ``openai`` SDK, unchanged, against a real server.

``spinf-serve serve spinf/tiny-gemma4 --device cpu`` runs as a child process, one for the module. The SDK sends its
own body to ``/v1/decisions`` and parses the answer into its ``Decision``: every question type, names echoed and
``null`` when unnamed, typed choice values, the SDK's limits (400 questions, 255 choices) and each refusal as the
SDK raises it. Every probability is checked against ``/v1/score`` on the equivalent score body (the mapping's own
function, and once a template written out by hand), and a question's answer is checked bit for bit alone, among
399 others and in concurrent calls (the CPU fp32 engine is batch-invariant). The tiny model's weights are random:
what is checked is the shape and the rules that tie the numbers together, not what they say.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

import spinf
from contrib.loadtest.harness import ServerProcess, tiny_cache
from spinf.decisions import plan_decisions
from spinf.server.openapi import openapi_document
from tests.media.fixtures import b64, image_bytes, noise_image

TOKEN = "tok"
CONTENT = "I was charged twice for order 1234. Please refund one payment, or I will cancel my account."
PREDICATE = {"type": "predicate", "instructions": "The customer asks for a refund.", "name": "refund"}
TOPIC = {
    "type": "choice",
    "instructions": "What is the message about?",
    "choices": [{"value": "billing", "description": "payments and refunds"}, {"value": "shipping"}],
    "name": "topic",
}
TYPED = {  # a string and a boolean with the same text, unnamed
    "type": "choice",
    "instructions": "Is the customer satisfied?",
    "choices": [{"value": True}, {"value": "true"}, {"value": False}, {"value": "false"}, {"value": "unsure"}],
}
ANGER = {
    "type": "score",
    "instructions": "How angry is the customer?",
    "levels": [{"label": "calm"}, {"label": "annoyed", "description": "mildly upset"}, {"label": "furious"}],
    "name": "anger",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decisions")
    process = ServerProcess(folder, "--token", TOKEN, hf_home=tiny_cache(folder / "hf-home"))
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(api_key=TOKEN, base_url=f"{server.url}/v1", max_retries=0, timeout=120)


def decide(client, *questions: dict, input: object = CONTENT, model: str = "tiny"):  # noqa: A002 - the SDK's name
    return client.decisions.create(model=model, input=input, questions=list(questions))


def scored(server, questions: list[dict], input: object = CONTENT) -> list[list[float]]:  # noqa: A002
    """Each question's ``p`` per option from ``/v1/score`` on the mapping's score body of the same call."""
    body = plan_decisions({"model": "tiny", "input": input, "questions": questions}).score_body()
    answer = httpx.post(f"{server.url}/v1/score", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    assert answer.status_code == 200, answer.text
    return [[o["p"] for o in q["combinations"][0]["options"]] for q in answer.json()["results"][0]["queries"]]


def probabilities(answer) -> list[float]:
    if answer.type == "predicate":
        return [answer.probability]
    return [p.probability for p in answer.probabilities]


def same_as_score(server, decision, questions: list[dict], input: object = CONTENT) -> None:  # noqa: A002
    expected = scored(server, questions, input)
    for answer, ps in zip(decision.answers, expected, strict=True):
        assert probabilities(answer) == (ps[:1] if answer.type == "predicate" else ps)


# every question type


def test_every_question_type_with_names_through_the_sdk(server, client):
    questions = [PREDICATE, TOPIC, TYPED, ANGER]
    decision = decide(client, *questions, model="TINY")  # an alias, in another case
    assert isinstance(decision, openai.types.Decision) and decision.model == "TINY"
    assert [a.type for a in decision.answers] == ["predicate", "choice", "choice", "score"]
    assert [a.name for a in decision.answers] == ["refund", "topic", None, "anger"]
    predicate, topic, typed, anger = decision.answers
    assert 0 <= predicate.probability <= 1
    assert [p.value for p in topic.probabilities] == ["billing", "shipping"]
    values = [p.value for p in typed.probabilities]
    assert values == [True, "true", False, "false", "unsure"]  # typed, as the SDK parses them (StrictBool, StrictStr)
    assert [type(v) for v in values] == [bool, str, bool, str, str]
    for answer in (topic, typed, anger):
        assert abs(sum(probabilities(answer)) - 1) < 1e-5 and 0 <= answer.confidence <= 1
        best = max(range(len(answer.probabilities)), key=lambda j: answer.probabilities[j].probability)
        winner = answer.probabilities[best]
        if answer.type == "choice":
            assert answer.choice == winner.value and type(answer.choice) is type(winner.value)
    assert [(p.label, p.value) for p in anger.probabilities] == [("calm", 0), ("annoyed", 1), ("furious", 2)]
    expected = sum(p.value * p.probability for p in anger.probabilities)
    assert math.isclose(anger.score, expected, abs_tol=1e-5)
    usage = decision.usage
    assert usage.input_tokens > 0 and usage.output_tokens == 0 and usage.total_tokens == usage.input_tokens
    assert (usage.input_tokens_details.cached_tokens, usage.input_tokens_details.cache_write_tokens) == (0, 0)
    same_as_score(server, decision, questions)


def test_unnamed_answers_carry_null_names_on_the_wire(server):
    answer = httpx.post(
        f"{server.url}/v1/decisions",
        json={"model": "tiny", "input": CONTENT, "questions": [TYPED, {**PREDICATE, "name": "p"}]},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert answer.status_code == 200
    body = answer.json()
    assert [a["name"] for a in body["answers"]] == [None, "p"]
    assert body["id"] == answer.headers["x-request-id"] and body["object"] == "decision"
    assert isinstance(body["answers"][0]["probabilities"][0]["value"], bool)


def test_a_predicate_equals_score_with_the_template_written_out(server, client):
    decision = decide(client, PREDICATE)
    template = (
        "\n\nStatement: The customer asks for a refund.\nIs the statement true of the input above? "
        "Answer true or false.\nAnswer:{?}"
    )
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": CONTENT}],
        "scoring": {"queries": [{"id": "r", "template": template, "options": [" true", " false"]}],
                    "empty_floor": False, "case_insensitive": False},
    }  # fmt: skip
    answer = httpx.post(f"{server.url}/v1/score", json=body, headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert decision.answers[0].probability == answer["results"][0]["queries"][0]["combinations"][0]["options"][0]["p"]


def test_messages_and_tool_items(server, client):
    items = [
        {"role": "system", "content": "Support inbox."},
        {"role": "user", "content": [{"type": "input_text", "text": "Order: "},
                                     {"type": "input_json", "data": {"id": 1234, "paid": [45.5, 45.5]}}]},
        {"type": "function_call", "call_id": "c1", "name": "refund", "arguments": '{"order": 1234}'},
        {"type": "function_call_output", "call_id": "c1", "output": "refunded"},
        {"role": "assistant", "content": "Your refund is on its way."},
    ]  # fmt: skip
    decision = decide(client, PREDICATE, ANGER, input=items)
    same_as_score(server, decision, [PREDICATE, ANGER], items)


def test_images_in_a_message_and_a_tool_output_are_read(server, client):
    photo = "data:image/png;base64," + b64(image_bytes(noise_image(40, 56, seed=3)))
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "My receipt: "},
                                     {"type": "input_image", "image_url": photo, "detail": "low"}]},
        {"type": "function_call", "call_id": "c1", "name": "scan", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_image", "image_url": photo}, {"type": "input_text", "text": "scanned"}]},
    ]  # fmt: skip
    decision = decide(client, PREDICATE, ANGER, input=items)
    same_as_score(server, decision, [PREDICATE, ANGER], items)
    # the images are read: as text instead, the input is shorter and the answers move
    as_text = [
        {"role": "user", "content": "My receipt: "},
        items[1],
        {"type": "function_call_output", "call_id": "c1", "output": "scanned"},
    ]
    without = decide(client, PREDICATE, ANGER, input=as_text)
    assert decision.usage.input_tokens > without.usage.input_tokens
    assert probabilities(decision.answers[0]) != probabilities(without.answers[0])


# the SDK's limits


def mixed(count: int) -> list[dict]:
    kinds = [PREDICATE, TOPIC, TYPED, ANGER]
    return [{**kinds[k % 4], "instructions": f"{kinds[k % 4]['instructions']} ({k})"} for k in range(count)]


def test_400_questions(server, client):
    questions = mixed(400)
    decision = decide(client, *questions)
    assert len(decision.answers) == 400
    assert [a.name for a in decision.answers] == [q.get("name") for q in questions]
    same_as_score(server, decision, questions)


def test_255_choices(server, client):
    question = {"type": "choice", "instructions": "Which code?", "choices": [{"value": f"c{j}"} for j in range(255)]}
    decision = decide(client, question)
    (answer,) = decision.answers
    assert [p.value for p in answer.probabilities] == [f"c{j}" for j in range(255)]
    same_as_score(server, decision, [question])


# invariance


def test_an_answer_is_bit_identical_alone_among_399_others_and_in_concurrent_calls(server, client):
    alone = decide(client, TYPED).answers[0]
    others = mixed(400)
    among = decide(client, *others[:137], TYPED, *others[138:]).answers[137]
    assert among.model_dump() == alone.model_dump()

    def call(k: int):
        questions = [*mixed(40 + 20 * k), TYPED]
        return decide(client, *questions).answers[-1]

    def score_call(_: int) -> list[list[float]]:  # a /v1/score call in the same passes
        return scored(server, mixed(60))

    with ThreadPoolExecutor(4) as pool:
        scores = [pool.submit(score_call, k) for k in range(2)]
        concurrent = list(pool.map(call, range(3)))
    assert all(answer.model_dump() == alone.model_dump() for answer in concurrent)
    assert scores[0].result() == scores[1].result()


# errors, as the SDK raises them

IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AA=="}


def refused(client, *questions: dict, input: object = CONTENT, model: str = "tiny") -> openai.BadRequestError:  # noqa: A002
    with pytest.raises(openai.BadRequestError) as caught:
        decide(client, *questions, input=input, model=model)
    error = caught.value
    assert error.status_code == 400 and error.type == "invalid_request"
    assert set(error.body) == {"type", "code", "message", "param"} and error.message
    return error


@pytest.mark.parametrize(
    ("questions", "input", "code", "param"),
    [
        ([], CONTENT, "invalid_field", "questions"),
        ([PREDICATE] * 401, CONTENT, "invalid_field", "questions"),
        ([{**TOPIC, "choices": [{"value": "a"}]}], CONTENT, "too_many_options", "questions.0.choices"),
        ([{**TOPIC, "choices": [{"value": f"{j}"} for j in range(256)]}], CONTENT, "too_many_options",
         "questions.0.choices"),
        ([PREDICATE, {**TOPIC, "choices": [{"value": "a"}, {"value": "a"}]}], CONTENT, "duplicate_option",
         "questions.1.choices.1"),
        ([{**TOPIC, "choices": [{"value": "a"}, {"value": "a rather long value of many words"}]}], CONTENT,
         "option_too_long", "questions.0.choices.1"),
        ([{**ANGER, "levels": [{"label": "low"}, {"label": "somewhat higher than low"}]}], CONTENT,
         "option_too_long", "questions.0.levels.1"),
        ([{**PREDICATE, "instructions": "word " * 300}], CONTENT, "template_too_long", "questions.0.instructions"),
        ([PREDICATE], "word " * 5000, "content_too_long", "input"),
        ([PREDICATE], [{"role": "user", "content": [IMAGE]}], "invalid_media", "input.0.content.0"),
        ([PREDICATE], [{"role": "user", "content": [{"type": "input_text", "text": "See: "},
                                                    {**IMAGE, "detail": "max"}]}],
         "invalid_media", "input.0.content.1"),
        ([{**PREDICATE, "instructions": [IMAGE]}], CONTENT, "media_not_supported", "questions.0.instructions.0"),
        ([PREDICATE], [{"type": "function_call_output", "call_id": "nope", "output": "x"}], "invalid_field",
         "input.0.call_id"),
        ([{"type": "rating", "instructions": "x"}], CONTENT, "invalid_field", "questions.0.type"),
    ],
)  # fmt: skip
def test_each_refusal(client, questions, input, code, param):  # noqa: A002
    error = refused(client, *questions, input=input)
    assert (error.code, error.param) == (code, param)


def test_a_model_that_is_not_served(client):
    error = refused(client, PREDICATE, model="gpt-6-luna")
    assert (error.code, error.param) == ("model_not_served", "model")


def test_a_wrong_token_and_a_body_that_is_not_json(server):
    wrong = openai.OpenAI(api_key="wrong", base_url=f"{server.url}/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        decide(wrong, PREDICATE)
    assert caught.value.code == "invalid_token"
    answer = httpx.post(f"{server.url}/v1/decisions", content=b"{", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"


def test_the_readme_example_runs_as_written(server):
    """README's decisions example (its block with ``client.decisions.create``), on this server's port and token."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "decisions.create" in block]
    code = code.replace("http://localhost:8000", server.url).replace('api_key="unused"', f'api_key="{TOKEN}"')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    probability, choice, score, tokens = out.getvalue().split()
    assert 0 <= float(probability) <= 1 and choice in {"billing", "shipping"} and 0 <= float(score) <= 2
    assert int(tokens) > 0


# the route's surroundings: the OpenAPI document, the access log and the metrics


def test_answers_validate_against_the_openapi_document_and_are_logged_and_counted(server):
    document = openapi_document(spinf.__version__)
    registry = Registry().with_resource("urn:doc", DRAFT202012.create_resource(document))
    responses = document["paths"]["/v1/decisions"]["post"]["responses"]

    def validator(status: int) -> Draft202012Validator:
        pointer = f"/paths/~1v1~1decisions/post/responses/{status}/content/application~1json/schema"
        if "$ref" in responses[str(status)]:
            pointer = responses[str(status)]["$ref"].removeprefix("#") + "/content/application~1json/schema"
        return Draft202012Validator({"$ref": f"urn:doc#{pointer}"}, registry=registry)

    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"model": "tiny", "input": CONTENT, "questions": [PREDICATE, TOPIC, TYPED, ANGER]}
    since = server.log_lines()
    answer = httpx.post(f"{server.url}/v1/decisions", json=body, headers=headers)
    validator(200).validate(answer.json())
    assert not validator(200).is_valid({**answer.json(), "extra": 1})
    bad = httpx.post(f"{server.url}/v1/decisions", json={**body, "questions": []}, headers=headers)
    validator(400).validate(bad.json())
    request_schema = Draft202012Validator({"$ref": "urn:doc#/components/schemas/DecisionRequest"}, registry=registry)
    request_schema.validate(body)
    assert server.durations_ms(since, 200, "/v1/decisions") and server.durations_ms(since, 400, "/v1/decisions")
    metrics = httpx.get(f"{server.url}/metrics").text
    assert re.search(r'spinf_requests_total\{route="/v1/decisions",status="200"\} [1-9]', metrics)
