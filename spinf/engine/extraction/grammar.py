"""The number grammar of `{n}` and `{$}` slots (engine spec A.12.4) as a pure state machine.

A number slot may only produce text this grammar accepts: an optional leading space, at most one sign (`-`, `−` or
an opening `(`), for `{$}` a currency symbol after the sign with at most one space after it, integer digits with `,`
groups (a comma must be followed by a digit), a `.` fraction, then optionally `%` or a whole-token scale word, and
the closing `)` when the number opened with `(`. The search feeds each candidate token's whole text through `feed`
and ends a beam's answer where `complete` holds; ``vocab`` precomputes the same transitions per tokenizer as a
table. The states are few (tens), so the table is small; the state keeps only what the future depends on plus the
spec's flags, and resets ``spaced`` when leaving the phase whose space it counts so equivalent prefixes (`"-5"` and
`" -5"`) share a state.
"""

from __future__ import annotations

import enum

import attrs

# Scale words are one symbol each, accepted only as a whole token with the leading space.
SCALE_WORDS = (" thousand", " million", " billion")
CURRENCY_SYMBOLS = "$€£¥"
# Every character a number slot's candidate token may contain (A.12.3).
NUMBER_ALPHABET = " 0123456789.,%()-−$€£¥"
_DIGITS = frozenset("0123456789")
_MINUS = frozenset("-−")  # the hyphen-minus and U+2212
_CURRENCY = frozenset(CURRENCY_SYMBOLS)


class Phase(enum.Enum):
    START = "start"  # nothing read, or only the leading space
    PRE = "pre"  # after the sign, the currency symbol, or the space after the currency symbol
    INT = "int"  # integer digits
    COMMA = "comma"  # a group comma: a digit must follow
    DOT = "dot"  # the decimal point
    FRAC = "frac"  # fraction digits
    POST = "post"  # after `%` or a scale word
    CLOSED = "closed"  # after the closing `)`


_COMPLETE_PHASES = frozenset({Phase.INT, Phase.DOT, Phase.FRAC, Phase.POST, Phase.CLOSED})


@attrs.frozen
class State:
    """Where a number stands. ``bracket``: an opening `(` is not closed yet; ``negative``: a sign was read;
    ``currency``: a currency symbol was read; ``spaced``: the one space this phase allows was read (the leading
    space in START, the space after the currency symbol in PRE)."""

    phase: Phase = Phase.START
    bracket: bool = False
    negative: bool = False
    currency: bool = False
    spaced: bool = False


START = State()


def step(state: State, symbol: str, currency_slot: bool) -> State | None:
    """The state after one symbol (a character, or a scale word of `SCALE_WORDS`), or None if it is not allowed.
    Currency symbols are allowed only when ``currency_slot`` (a `{$}` slot)."""
    if symbol in _DIGITS:
        return _digit(state)
    phase = state.phase
    if phase is Phase.START:
        return _from_start(state, symbol, currency_slot)
    if phase is Phase.PRE:
        return _from_pre(state, symbol, currency_slot)
    if phase is Phase.INT and symbol in (",", "."):
        return attrs.evolve(state, phase=Phase.COMMA if symbol == "," else Phase.DOT)
    if phase in (Phase.INT, Phase.FRAC) and (symbol == "%" or symbol in SCALE_WORDS):
        return attrs.evolve(state, phase=Phase.POST)
    if phase in (Phase.INT, Phase.FRAC, Phase.POST) and symbol == ")" and state.bracket:
        return attrs.evolve(state, phase=Phase.CLOSED, bracket=False)
    return None  # COMMA and DOT take a digit only, CLOSED nothing


def feed(state: State | None, text: str, currency_slot: bool) -> State | None:
    """The state after a token's whole text, or None if any of it is not allowed. A scale word counts only as the
    whole text of a token (`" million"`); inside a longer text its letters are not allowed. An empty text leaves
    the state as it is (the vocabulary tables never offer such a token)."""
    if state is not None and text in SCALE_WORDS:
        return step(state, text, currency_slot)
    for char in text:
        if state is None:
            return None
        state = step(state, char, currency_slot)
    return state


def complete(state: State | None) -> bool:
    """Whether a number may end here: a digit was read, the last symbol was not a comma, no bracket is open.
    `"3."` is complete (a sentence-final period); `"(168"` never is."""
    return state is not None and state.phase in _COMPLETE_PHASES and not state.bracket


def _digit(state: State) -> State | None:
    if state.phase in (Phase.START, Phase.PRE, Phase.INT, Phase.COMMA):
        return attrs.evolve(state, phase=Phase.INT, spaced=False)
    if state.phase in (Phase.DOT, Phase.FRAC):
        return attrs.evolve(state, phase=Phase.FRAC)
    return None


def _from_start(state: State, symbol: str, currency_slot: bool) -> State | None:
    if symbol == " " and not state.spaced:
        return attrs.evolve(state, spaced=True)
    if symbol in _MINUS:
        return attrs.evolve(state, phase=Phase.PRE, negative=True, spaced=False)
    if symbol == "(":
        return attrs.evolve(state, phase=Phase.PRE, negative=True, bracket=True, spaced=False)
    return _currency(state, symbol, currency_slot)


def _from_pre(state: State, symbol: str, currency_slot: bool) -> State | None:
    # In PRE, a currency symbol read and no space yet means the currency symbol was the last symbol: nothing else
    # may follow it but that space or a digit.
    if symbol == " " and state.currency and not state.spaced:
        return attrs.evolve(state, spaced=True)
    return _currency(state, symbol, currency_slot)


def _currency(state: State, symbol: str, currency_slot: bool) -> State | None:
    if currency_slot and symbol in _CURRENCY and not state.currency:
        return attrs.evolve(state, phase=Phase.PRE, currency=True, spaced=False)
    return None
