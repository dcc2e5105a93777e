"""One decision call, both ways: the ``/v1/score`` body it becomes, and the Decision its score response becomes.

`plan_decisions` checks the SDK's body (`spinf.decisions.request`) and writes it out in the served model's prompt
style (`spinf.decisions.render`): one input, the content, and one scored query per question, with the floor off
(a Decision has no floor) and case variants off (values are typed and exact: ``"Yes"`` and ``"yes"`` are two
choices, and an option is read only as written). The engine then parses and checks that body like any other
(`spinf.protocol.request.parse_score_request`), so its refusals come back with score-body params, which
`DecisionCall.translate` maps onto the SDK's body (``scoring.queries.3.options.1`` -> ``questions.3.choices.1``).

`DecisionCall.answer` reads the score response: ``probability`` and ``probabilities`` are each option's ``p`` (the
softmax over the offered values) as /v1/score gives it; ``confidence`` is the winning value's full-vocabulary
mass, exp(``logprob``); ``score`` is the probability-weighted mean of the zero-based level index, computed from
the logprobs. ``usage.input_tokens`` is the score call's ``prompt_tokens`` (the content once, every question's
template and its options' tokens beyond the first); nothing is generated and no prompt cache is kept, so the
output, reasoning, cached and cache-write counts are 0.
"""

from __future__ import annotations

import math
import re

import attrs

from spinf.decisions.render import ScoredQuestion, score_content, scored_question
from spinf.decisions.request import DecisionRequest, Question, parse_decision_request
from spinf.decisions.styles import DEFAULT_STYLE, PromptStyle, style_for
from spinf.errors import ApiError

_QUERY_PARAM = re.compile(r"^scoring\.queries\.(\d+)(?:\.(.*))?$")
_OPTION_PARAM = re.compile(r"^options\.(\d+)(?:\..*)?$")
_PART_PARAM = re.compile(r"^(?:inputs\.0\.)?messages\.0\.content\.(\d+)(?:\.(.*))?$")
_IMAGE_FIELDS = {"image_url.url": "image_url", "image_url.detail": "detail"}  # a score part's field -> the SDK's


@attrs.frozen
class DecisionCall:
    request: DecisionRequest
    content: str | list[dict]  # the text, or score-body parts when the input holds images
    questions: tuple[ScoredQuestion, ...]
    content_params: tuple[str, ...] = ()  # per part of a list content, its SDK path

    def score_body(self) -> dict:
        """The ``/v1/score`` body of this call: one input, one scored query per question (ids ``"0"``, ``"1"``...)."""
        queries = [
            {"id": str(k), "template": q.template, "options": list(q.options)} for k, q in enumerate(self.questions)
        ]
        return {
            "model": self.request.model,
            "messages": [{"role": "user", "content": self.content}],
            "scoring": {"queries": queries, "empty_floor": False, "case_insensitive": False},
        }

    def translate(self, exc: ApiError) -> ApiError:
        """A refusal of the score body, with its param on the decisions body (the code and message kept)."""
        return ApiError(exc.status, exc.code, self._param(exc.param), exc.message, retry_after=exc.retry_after)

    def _param(self, param: str | None) -> str | None:
        if param is None or param == "model":
            return param
        part = _PART_PARAM.match(param)
        if part is not None and int(part[1]) < len(self.content_params):
            at = self.content_params[int(part[1])]
            field = _IMAGE_FIELDS.get(part[2] or "")
            return at if at == "input" or field is None else f"{at}.{field}"
        if param.startswith(("inputs.0", "messages")):
            return "input"
        match = _QUERY_PARAM.match(param)
        if match is None or int(match[1]) >= len(self.questions):
            return None
        k, rest = int(match[1]), match[2] or ""
        question = self.questions[k]
        option = _OPTION_PARAM.match(rest)
        if option is not None and int(option[1]) < len(question.option_params):
            return question.option_params[int(option[1])]
        if rest == "options":
            return question.options_param
        if rest.startswith(("template", "combinations")):
            return f"questions.{k}.instructions"
        return f"questions.{k}"

    def answer(self, response: dict) -> dict:
        """The Decision body (``openai.types.Decision``) of the score response to `score_body`."""
        scored = response["results"][0]["queries"]
        answers = [
            _answer(question, scored[k]["combinations"][0]["options"])
            for k, question in enumerate(self.request.questions)
        ]
        input_tokens = response["usage"]["prompt_tokens"]
        usage = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens,
        }
        return {"id": response["id"], "object": "decision", "model": response["model"], "answers": answers,
                "usage": usage}  # fmt: skip


def plan_decisions(body: object, prompt_style: str = DEFAULT_STYLE.name) -> DecisionCall:
    """The call of a ``POST /v1/decisions`` body in the served model's ``prompt_style``, or `ApiError` (400)."""
    request = parse_decision_request(body)
    style: PromptStyle = style_for(prompt_style)
    questions = tuple(scored_question(q, f"questions.{k}", style) for k, q in enumerate(request.questions))
    content, params = score_content(request, style)
    return DecisionCall(request, content, questions, params)


def _answer(question: Question, options: list[dict]) -> dict:
    head = {"type": question.kind, "name": question.name}
    if question.kind == "predicate":
        return {**head, "probability": options[0]["p"]}
    logprobs = [option["logprob"] for option in options]
    best = max(range(len(logprobs)), key=logprobs.__getitem__)  # the first of equals
    confidence = round(math.exp(logprobs[best]), 6)
    if question.kind == "choice":
        pairs = zip(question.values, options, strict=True)
        probabilities = [{"value": v.value, "probability": o["p"]} for v, o in pairs]
        return {**head, "choice": question.values[best].value, "confidence": confidence,
                "probabilities": probabilities}  # fmt: skip
    probabilities = [
        {"label": v.value, "value": j, "probability": o["p"]}
        for j, (v, o) in enumerate(zip(question.values, options, strict=True))
    ]
    return {**head, "score": _mean_index(logprobs), "confidence": confidence, "probabilities": probabilities}


def _mean_index(logprobs: list[float]) -> float:
    """Σ j · p_j with p the softmax of ``logprobs`` (exact, not from the rounded ``p``), rounded to 6 decimals."""
    top = max(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]
    return round(sum(j * w for j, w in enumerate(weights)) / sum(weights), 6)
