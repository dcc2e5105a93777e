"""A parsed decision call written out as scoring: the input as one content text, each question as one query.

The content: a string input as it is; a list of items one text per item (a message as ``Role: text``, a tool call
and its output by name), joined by the style's separator. Parts are concatenated as they are (api spec §4.3), a JSON
part as compact JSON. Trailing whitespace is dropped, so every question's template (which starts with a blank line)
joins the content at a clean token boundary (api spec §4.8).

A question: its template in the style's wording (the instructions, and for a choice with descriptions or a score
the listing of its values), escaped for the template grammar and ended by ``{?}``; its options are the values
written as JSON after a space (``"refund"`` with its quotes, ``true``), so a string and a boolean with the same
text are two options, and no option is a prefix of another as text (a JSON string ends with its closing quote). A
predicate's options are the style's true and false.
"""

from __future__ import annotations

import attrs

from spinf.decisions.request import DecisionRequest, Item, Part, Question, compact_json
from spinf.decisions.styles import PromptStyle


@attrs.frozen
class ScoredQuestion:
    """A question as a scored query: its template (``{?}`` last) and options, and the SDK's param path of each
    option (a predicate's options are ours: the question's own path)."""

    template: str
    options: tuple[str, ...]
    option_params: tuple[str, ...]
    options_param: str


def content_text(request: DecisionRequest, style: PromptStyle) -> str:
    if isinstance(request.input, str):
        return request.input.rstrip()
    return style.separator.join(_item(item, style) for item in request.input).rstrip()


def _item(item: Item, style: PromptStyle) -> str:
    if item.kind == "message":
        return style.message.format(role=style.roles[item.role], text=parts_text(item.parts))
    if item.kind == "function_call":
        return style.function_call.format(name=item.name, arguments=item.text)
    if item.kind == "custom_tool_call":
        return style.custom_tool_call.format(name=item.name, input=item.text)
    pattern = style.function_call_output if item.kind == "function_call_output" else style.custom_tool_call_output
    return pattern.format(name=item.name, output=parts_text(item.parts))


def parts_text(parts: tuple[Part, ...]) -> str:
    return "".join(compact_json(part.data) if part.kind == "json" else part.text for part in parts)


def value_text(value: str | bool) -> str:
    """A value as prompts and options write it: one-to-one, so distinct values never share an option."""
    if isinstance(value, bool) or value in ("true", "false") or value.startswith('"'):
        return compact_json(value)
    return value


def option_text(value: str | bool, style: PromptStyle) -> str:
    """The scored option of a choice's value or a level's label."""
    return style.option.format(value=value_text(value))


def scored_question(question: Question, at: str, style: PromptStyle) -> ScoredQuestion:
    """``question`` (whose SDK path is ``at``) as a template and options in ``style``."""
    instructions = parts_text(question.instructions)
    if question.kind == "predicate":
        text = style.predicate.format(instructions=instructions)
        return ScoredQuestion(_template(text), style.predicate_options, (at, at), at)
    lines = "".join(
        style.line.format(value=value_text(v.value))
        if v.description is None
        else style.described_line.format(value=value_text(v.value), description=v.description)
        for v in question.values
    )
    if question.kind == "choice":
        described = any(v.description is not None for v in question.values)
        listing = style.choices_listing.format(lines=lines) if described else ""
        text, where = style.choice.format(instructions=instructions, choices=listing), f"{at}.choices"
    else:
        text = style.score.format(instructions=instructions, levels=style.levels_listing.format(lines=lines))
        where = f"{at}.levels"
    options = tuple(option_text(v.value, style) for v in question.values)
    params = tuple(f"{where}.{j}" for j in range(len(options)))
    return ScoredQuestion(_template(text), options, params, where)


def _template(text: str) -> str:
    """``text`` as literal template text (api spec §4.6: ``{{`` and ``}}``), then the scored slot."""
    return text.replace("{", "{{").replace("}", "}}") + "{?}"
