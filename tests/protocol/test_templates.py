"""The template grammar of api spec §4.6: what parses to what, and every way a template is refused."""

from __future__ import annotations

import pytest

from spinf.errors import ApiError
from spinf.protocol.templates import parse_template
from spinf.protocol.types import Placeholder, Slot

P = Placeholder


@pytest.mark.parametrize(
    ("text", "pieces", "names", "slot", "stop_text"),
    [
        ("{?}", (), (), Slot.SCORE, ""),
        ("{*}", (), (), Slot.TEXT, ""),
        ("{n}", (), (), Slot.NUMBER, ""),
        ("{$}", (), (), Slot.CURRENCY, ""),
        ("Is {who} happy?{?}", ("Is ", P("who"), " happy?"), ("who",), Slot.SCORE, ""),
        ("{a}{b}{a} {?}", (P("a"), P("b"), P("a"), " "), ("a", "b"), Slot.SCORE, ""),
        ("{A_1}{x9}{_}{?}", (P("A_1"), P("x9"), P("_")), ("A_1", "x9", "_"), Slot.SCORE, ""),
        ('The {x} is "{*}"', ("The ", P("x"), ' is "'), ("x",), Slot.TEXT, '"'),
        ("{n} people said '{*}'.", (P("n"), " people said '"), ("n",), Slot.TEXT, "'."),
        ("Total: {$}", ("Total: ",), (), Slot.CURRENCY, ""),
        ("Count {x}: {n}", ("Count ", P("x"), ": "), ("x",), Slot.NUMBER, ""),
        ("{{literal}} {{?}} {{*}}{?}", ("{literal} {?} {*}",), (), Slot.SCORE, ""),
        ("a {{n}} b{n}", ("a {n} b",), (), Slot.NUMBER, ""),
        ("{*}}}", (), (), Slot.TEXT, "}"),
        ("say {*} {{?}} ok", ("say ",), (), Slot.TEXT, " {?} ok"),
        ("{a}{b}{c}{d}{e}{a}{?}", tuple(P(n) for n in "abcdea"), tuple("abcde"), Slot.SCORE, ""),
    ],
)
def test_parses(text, pieces, names, slot, stop_text):
    template = parse_template(text, "scoring.queries.0")
    assert (template.text, template.pieces, template.names, template.slot, template.stop_text) == (
        text,
        pieces,
        names,
        slot,
        stop_text,
    )


def test_fill_substitutes_values_verbatim():
    template = parse_template("{a} and {b}, {a}{?}", "q")
    assert template.fill({"a": "{x}", "b": "}}"}) == "{x} and }}, {x}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"^the template has no slot; it needs exactly one of \{\?\}, \{\*\}, \{n\} or \{\$\}$"),
        ("plain text", r"^the template has no slot; .*$"),
        ("{{?}}", r"^the template has no slot; .*$"),
        ("{x}", r"^the template has no slot; .*$"),
        ("ab}", r"^stray '\}' at position 2; write '\}\}' for a literal brace$"),
        ("{?}}", r"^stray '\}' at position 3; .*$"),
        ("abc{", r"^unclosed '\{' at position 3; write '\{\{' for a literal brace$"),
        ("x{a{b}{?}", r"^unclosed '\{' at position 1; .*$"),
        ("Is {a-b}{?}", r"^invalid placeholder '\{a-b\}' at position 3: names match \[A-Za-z0-9_\]\+, .*$"),
        ("{}{?}", r"^invalid placeholder '\{\}' at position 0: .*$"),
        ("{ a }{?}", r"^invalid placeholder '\{ a \}' at position 0: .*$"),
        ("{é}{?}", r"^invalid placeholder '\{é\}' at position 0: .*$"),
        ("{?} and", r"^the slot \{\?\} must be the last thing in the template$"),
        ("{{{?}}}", r"^the slot \{\?\} must be the last thing in the template$"),
        ("{n} more", r"^the slot \{n\} must be the last thing in the template$"),
        ("{$}.", r"^the slot \{\$\} must be the last thing in the template$"),
        ("x {n} {?}", r"^the template has the extraction slot \{n\} \(the number slot .*\) and a \{\?\} as well; .*$"),
        ("{?}{n}", r"^the template has the extraction slot \{n\} .* and a \{\?\} as well; .*$"),
        ("{*} {?}", r"^the template has the extraction slot \{\*\} and a \{\?\} as well; .*$"),
        ("{$}{?}", r"^the template has the extraction slot \{\$\} and a \{\?\} as well; .*$"),
        ("{?}{?}", r"^the template has more than one slot; it may have exactly one$"),
        ("{*} {*}", r"^the template has more than one slot; .*$"),
        ("{n}{n}", r"^the template has more than one slot; .*$"),
        ("{*}{$}", r"^the template has more than one slot; .*$"),
        ("{$}{n}", r"^the template has more than one slot; .*$"),
        ('"{*}" {x}', r"^the stop text after \{\*\} may not contain a placeholder or another slot$"),
        ('"{*}" {n}', r"^the stop text after \{\*\} may not contain a placeholder or another slot$"),
        ('"{*}"\n', r"^the stop text after \{\*\} must stay on the slot's line \(no newline\)$"),
        ("{a}{b}{c}{d}{e}{f}{?}", r"^the template has 6 distinct placeholders; at most 5$"),
        ("{n}{a}{b}{c}{d}{e}{*}", r"^the template has 6 distinct placeholders; at most 5$"),
    ],
)
def test_refused(text, message):
    with pytest.raises(ApiError, match=message) as info:
        parse_template(text, "inputs.2.queries.1")
    error = info.value
    assert (error.status, error.code, error.param) == (400, "invalid_template", "inputs.2.queries.1.template")
