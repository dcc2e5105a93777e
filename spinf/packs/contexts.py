"""Filling a pack's context and wrapping content in it (packs spec §1.5).

A context is split at its one ``{X}`` into the text before and after the caller's content. Each declared parameter,
in declaration order, takes the caller's value, else its default; a null value is no value (an error when the
parameter is required, ``""`` when optional), a name the pack does not declare is an error (the first in sorted
order), and every value is written as Python's ``str()`` writes it. Then each ``{name}`` in the two texts is replaced,
parameter by parameter in declaration order; queries are never filled. Wrapping puts the texts around a message
list's content as text parts (empty ones left out). Errors are `ParameterError`; the server maps them to its
``invalid_field`` at the input's ``parameters`` (``api.md`` §4.10).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spinf.packs.packfile import PackFile


class ParameterError(ValueError):
    """A required parameter without a value, or a value for a parameter the pack does not declare."""


def parameter_values(pack: PackFile, given: Mapping[str, object] | None = None) -> dict[str, str]:
    """Every declared parameter's text, in declaration order."""
    given = given or {}
    declared = {parameter.name for parameter in pack.parameters}
    unknown = sorted(name for name in given if name not in declared)
    if unknown:
        raise ParameterError(f"{pack.id} has no parameter {unknown[0]!r}")
    values = {}
    for parameter in pack.parameters:
        value = given[parameter.name] if parameter.name in given else parameter.default
        if value is None:
            if parameter.required:
                raise ParameterError(f"the parameter {parameter.name!r} of {pack.id} is required")
            value = ""
        values[parameter.name] = str(value)
    return values


def context_texts(pack: PackFile, context: str | None = None, given: Mapping | None = None) -> tuple[str, str]:
    """The texts before and after the content in ``context`` (default: the first), parameters filled."""
    template = dict(pack.contexts)[context or pack.default_context]
    before, _, after = template.partition("{X}")
    for name, value in parameter_values(pack, given).items():
        before = before.replace("{" + name + "}", value)
        after = after.replace("{" + name + "}", value)
    return before, after


def _parts(content: str | Sequence[dict]) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _text(text: str) -> list[dict]:
    return [{"type": "text", "text": text}] if text else []


def wrap_messages(messages: Sequence[dict], before: str, after: str) -> list[dict]:
    """``messages`` with ``before`` at the front of the first message's content and ``after`` at the end of the last
    one's (one message: both around it); string content becomes one text part. The input is not changed."""
    out = [dict(message) for message in messages]
    out[0]["content"] = _text(before) + _parts(out[0]["content"])
    out[-1]["content"] = _parts(out[-1]["content"]) + _text(after)
    return out


def wrap_text(pack: PackFile, text: str, context: str | None = None, given: Mapping | None = None) -> list[dict]:
    """One text as content parts in ``context``: what spinf-client's ``packs.wrap`` gives."""
    before, after = context_texts(pack, context, given)
    return _text(before) + _parts(text) + _text(after)
