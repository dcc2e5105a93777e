"""The template grammar of api spec §4.6: literal text, up to 5 `{name}` placeholders and exactly one slot.

`parse_template` turns a query's template string into a `Template` or raises 400 ``invalid_template`` with param
``<q>.template``. It works in two passes. The first splits the text into literal runs and brace groups, resolving
the ``{{``/``}}`` escapes and refusing anything in braces that is neither a slot marker nor a name (the message gives
the 0-based character position). The second picks the slot the way the reference does, looking for ``{*}`` first,
then ``{n}``, then ``{$}``, then ``{?}``; so ``{n}`` is a placeholder named ``n`` in a ``{*}`` template and the
number slot everywhere else, which is why a ``{n}`` in a ``{?}`` template is an error.
"""

from __future__ import annotations

import re

from spinf.errors import ApiError, bad_request
from spinf.protocol.types import Placeholder, Slot, Template

MAX_PLACEHOLDERS = 5

# Left to right at each position: the two escapes, then a whole brace group, then a lone brace (always an error).
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_NAME = re.compile(r"[A-Za-z0-9_]+")
_MARKERS = {"*": Slot.TEXT, "?": Slot.SCORE, "$": Slot.CURRENCY}
# The grammar above as one JSON Schema pattern (ECMA-262 and Python alike), for the OpenAPI document: a {*} template
# (any placeholder before it, {n} included; after it literal text without a newline), or {n}, {$} or {?} last with
# no {n} before it. It cannot count distinct names, so the limit of 5 stays in words. `$(?!\n)` ends the string in
# both dialects: Python's `$` also matches before a final newline.
_LITERAL, _STOP = r"[^{}]|\{\{|\}\}", r"[^{}\n]|\{\{|\}\}"
_NAMED, _NOT_N = r"\{[A-Za-z0-9_]+\}", r"\{(?!n\})[A-Za-z0-9_]+\}"
TEMPLATE_PATTERN = rf"^(?:(?:{_LITERAL}|{_NAMED})*\{{\*\}}(?:{_STOP})*|(?:{_LITERAL}|{_NOT_N})*\{{[n$?]\}})$(?!\n)"


def parse_template(text: str, path: str) -> Template:
    """Parse ``text``, the template of the query at param path ``path`` (§4.6)."""
    param = f"{path}.template"
    tokens = _tokens(text, param)
    slot = _find_slot(tokens)
    if slot is None:
        raise _error(param, "the template has no slot; it needs exactly one of {?}, {*}, {n} or {$}")
    if slot is Slot.NUMBER:
        tokens = [Slot.NUMBER if t == Placeholder("n") else t for t in tokens]
    at = _check_slots(tokens, slot, param)
    pieces, stop = tokens[:at], tokens[at + 1 :]
    if any(not isinstance(t, str) for t in stop):
        raise _error(param, "the stop text after {*} may not contain a placeholder or another slot")
    stop_text = "".join(stop)
    if "\n" in stop_text:
        raise _error(param, "the stop text after {*} must stay on the slot's line (no newline)")
    names = tuple(dict.fromkeys(p.name for p in pieces if isinstance(p, Placeholder)))
    if len(names) > MAX_PLACEHOLDERS:
        raise _error(param, f"the template has {len(names)} distinct placeholders; at most {MAX_PLACEHOLDERS}")
    return Template(text=text, pieces=tuple(pieces), names=names, slot=slot, stop_text=stop_text)


def _tokens(text: str, param: str) -> list[str | Placeholder | Slot]:
    """Literal runs (escapes resolved, adjacent runs merged), placeholders and slot markers, in order.

    ``{n}`` comes out as ``Placeholder("n")``: whether it is the number slot depends on the whole template.
    """
    tokens: list[str | Placeholder | Slot] = []

    def literal(s: str) -> None:
        if not s:
            return
        if tokens and isinstance(tokens[-1], str):
            tokens[-1] += s
        else:
            tokens.append(s)

    end = 0
    for match in _TOKEN.finditer(text):
        literal(text[end : match.start()])
        end = match.end()
        group, inner = match.group(), match.group(1)
        if group in ("{{", "}}"):
            literal(group[0])
        elif group == "}":
            raise _error(param, f"stray '}}' at position {match.start()}; write '}}}}' for a literal brace")
        elif group == "{":
            raise _error(param, f"unclosed '{{' at position {match.start()}; write '{{{{' for a literal brace")
        elif inner in _MARKERS:
            tokens.append(_MARKERS[inner])
        elif _NAME.fullmatch(inner):
            tokens.append(Placeholder(inner))
        else:
            raise _error(
                param,
                f"invalid placeholder {group!r} at position {match.start()}: names match [A-Za-z0-9_]+, "
                "slots are {?}, {*}, {n} and {$}",
            )
    literal(text[end:])
    return tokens


def _find_slot(tokens: list[str | Placeholder | Slot]) -> Slot | None:
    """The template's slot kind, in the reference's detection order: {*}, {n}, {$}, {?}."""
    if Slot.TEXT in tokens:
        return Slot.TEXT
    if Placeholder("n") in tokens:
        return Slot.NUMBER
    for slot in (Slot.CURRENCY, Slot.SCORE):
        if slot in tokens:
            return slot
    return None


def _check_slots(tokens: list[str | Placeholder | Slot], slot: Slot, param: str) -> int:
    """Check that ``slot`` is the one slot and stands where it may; return its index."""
    positions = [i for i, t in enumerate(tokens) if isinstance(t, Slot)]
    kinds = {tokens[i] for i in positions}
    if slot is not Slot.SCORE and Slot.SCORE in kinds:
        which = "{n} (the number slot unless the template has a {*})" if slot is Slot.NUMBER else f"{{{slot.value}}}"
        raise _error(
            param, f"the template has the extraction slot {which} and a {{?}} as well; a template has exactly one slot"
        )
    if len(positions) > 1:
        raise _error(param, "the template has more than one slot; it may have exactly one")
    at = positions[0]
    if slot is not Slot.TEXT and at != len(tokens) - 1:
        raise _error(param, f"the slot {{{slot.value}}} must be the last thing in the template")
    return at


def _error(param: str, message: str) -> ApiError:
    return bad_request("invalid_template", param, message)
