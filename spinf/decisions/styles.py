"""Prompt styles: the wording that turns a decision question into a scored query, in one place.

A style is keyed by the name a model manifest gives in ``prompt_style`` (`spinf.catalog.manifest.PROMPT_STYLES`),
so a model trained for decisions can bring its own wording. Every field is a `str.format` pattern whose fields are
filled with the caller's text as it is; the finished template is escaped for the template grammar afterwards (api
spec §4.6), so braces in instructions, descriptions or JSON parts are literal text. docs/decisions.md shows the
prompts these patterns give.

Only ``default`` has wording so far: the ``decider`` model reads its answers as its own 255 answer codes (engine
spec A.15), whose prompt format this build does not know, so `style_for` refuses it rather than guess.
"""

from __future__ import annotations

import attrs

from spinf.errors import bad_request


@attrs.frozen
class PromptStyle:
    """One model family's wording of the three question types and of the input's items."""

    name: str
    # a question: ``{instructions}`` is the question's text; ``{choices}`` / ``{levels}`` the listing (or "")
    predicate: str
    predicate_options: tuple[str, str]  # (true, false): the option texts, each read by the chain rule
    choice: str
    score: str
    choices_listing: str  # ``{lines}``: the choices' lines; used when any choice has a description
    levels_listing: str  # ``{lines}``: the levels' lines, lowest first; always used
    line: str  # ``{value}``: a value as written (`spinf.decisions.render.value_text`)
    described_line: str  # ``{value}``, ``{description}``
    option: str  # ``{value}``: the scored option of a value as written
    # the input: one item per message or tool item, joined with ``separator``
    separator: str
    roles: dict[str, str]
    message: str  # ``{role}`` (from ``roles``), ``{text}``
    function_call: str  # ``{name}``, ``{arguments}``
    function_call_output: str  # ``{name}`` (of the matching call), ``{output}``
    custom_tool_call: str  # ``{name}``, ``{input}``
    custom_tool_call_output: str  # ``{name}``, ``{output}``


DEFAULT_STYLE = PromptStyle(
    name="default",
    predicate=(
        "\n\nStatement: {instructions}\nIs the statement true of the input above? Answer true or false.\nAnswer:"
    ),
    predicate_options=(" true", " false"),
    choice="\n\nQuestion: {instructions}\n{choices}Answer:",
    score="\n\nQuestion: {instructions}\n{levels}Answer with one level.\nAnswer:",
    choices_listing="Choices:\n{lines}Answer with one choice.\n",
    levels_listing="Levels, from lowest to highest:\n{lines}",
    line="- {value}\n",
    described_line="- {value}: {description}\n",
    option=" {value}",
    separator="\n\n",
    roles={"user": "User", "developer": "Developer", "system": "System", "assistant": "Assistant"},
    message="{role}: {text}",
    function_call="Function call {name}: {arguments}",
    function_call_output="Function output ({name}): {output}",
    custom_tool_call="Tool call {name}: {input}",
    custom_tool_call_output="Tool output ({name}): {output}",
)

STYLES: dict[str, PromptStyle] = {DEFAULT_STYLE.name: DEFAULT_STYLE}


def style_for(name: str) -> PromptStyle:
    """The style a manifest's ``prompt_style`` names; 400 ``model_not_served`` (param ``model``) for one without
    decision wording, since no decision call can be answered on that model."""
    style = STYLES.get(name)
    if style is None:
        raise bad_request(
            "model_not_served",
            "model",
            f"the served model's prompt style {name!r} has no decision wording: POST /v1/decisions is not served "
            "for it (docs/decisions.md)",
        )
    return style
