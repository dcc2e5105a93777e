"""A parsed decision call written out as scoring: the input as one content, each question as one query.

The content: a string input as it is; a list of items one text per item (a message as ``Role: text``, a tool call
and its output by name), joined by the style's separator. Parts are concatenated as they are (api spec §4.3), a JSON
part as compact JSON. Trailing whitespace is dropped, so every question's template (which starts with a blank line)
joins the content at a clean token boundary (api spec §4.8). An input with images is a list of score-body parts
instead: the same text cut where each image stands, and each image an ``image_url`` part (its data URL and detail).

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


_CUT = "\x00"  # where an item's parts go in its pattern (no pattern holds it)


def score_content(request: DecisionRequest, style: PromptStyle) -> tuple[str | list[dict], tuple[str, ...]]:
    """The score body's content and, for a list of parts, each part's SDK path (``input`` for a text part, the
    ``input_image``'s own for an image part): a string when the input holds no image."""
    if isinstance(request.input, str):
        return request.input.rstrip(), ()
    pieces: list[str | Part] = []
    for k, item in enumerate(request.input):
        if k:
            pieces.append(style.separator)
        pieces.extend(_item(item, style))
    merged: list[str | Part] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        elif piece != "":
            merged.append(piece)
    if merged and isinstance(merged[-1], str):
        merged[-1] = merged[-1].rstrip()
    if not any(isinstance(piece, Part) for piece in merged):
        return "".join(merged), ()
    parts, params = [], []
    for piece in merged:
        if isinstance(piece, Part):
            parts.append({"type": "image_url", "image_url": {"url": piece.url, "detail": piece.detail}})
            params.append(piece.at)
        elif piece:
            parts.append({"type": "text", "text": piece})
            params.append("input")
    return parts, tuple(params)


def _item(item: Item, style: PromptStyle) -> list[str | Part]:
    if item.kind == "message":
        return _around(style.message.format(role=style.roles[item.role], text=_CUT), item.parts)
    if item.kind == "function_call":
        return [style.function_call.format(name=item.name, arguments=item.text)]
    if item.kind == "custom_tool_call":
        return [style.custom_tool_call.format(name=item.name, input=item.text)]
    pattern = style.function_call_output if item.kind == "function_call_output" else style.custom_tool_call_output
    return _around(pattern.format(name=item.name, output=_CUT), item.parts)


def _around(pattern: str, parts: tuple[Part, ...]) -> list[str | Part]:
    """``pattern`` with ``parts`` where its cut is: texts as text, images as parts."""
    head, tail = pattern.split(_CUT)
    return [head, *(part if part.kind == "image" else _part_text(part) for part in parts), tail]


def _part_text(part: Part) -> str:
    return compact_json(part.data) if part.kind == "json" else part.text


def parts_text(parts: tuple[Part, ...]) -> str:
    return "".join(_part_text(part) for part in parts)


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
