"""The OpenAI Decisions API (``POST /v1/decisions``) mapped onto scoring, in pure Python: no engine, torch or trio.

`plan_decisions` turns the ``openai`` SDK's body into a `DecisionCall`, whose ``score_body()`` goes through the
engine loop like any ``/v1/score`` call and whose ``answer()`` turns the score response into the SDK's
``Decision``; ``translate()`` puts a refusal of the score body back on the SDK's param paths. docs/decisions.md
describes the mapping: the prompt wording per question type (`spinf.decisions.styles`, keyed by the manifest's
``prompt_style``), the options, the numbers and the limits.
"""

from spinf.decisions.call import DecisionCall, plan_decisions
from spinf.decisions.request import MAX_CHOICES, MAX_LEVELS, MAX_QUESTIONS, DecisionRequest, parse_decision_request
from spinf.decisions.styles import DEFAULT_STYLE, STYLES, PromptStyle, style_for

__all__ = [
    "DEFAULT_STYLE",
    "MAX_CHOICES",
    "MAX_LEVELS",
    "MAX_QUESTIONS",
    "STYLES",
    "DecisionCall",
    "DecisionRequest",
    "PromptStyle",
    "parse_decision_request",
    "plan_decisions",
    "style_for",
]
