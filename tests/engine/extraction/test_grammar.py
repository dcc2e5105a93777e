"""The number grammar (engine spec A.12.4): each rule, the spec's examples, and an exhaustive check against an
independent regular-expression formulation of the language over every short string of a small alphabet."""

import itertools
import re

import pytest

from spinf.engine.extraction.grammar import START, Phase, State, complete, feed, step


def accepts(text, currency_slot=True):
    return complete(feed(START, text, currency_slot))


def tokens(*texts, currency_slot=True):
    """Feed several token texts in turn (a scale word is only ever a whole token)."""
    state = START
    for text in texts:
        state = feed(state, text, currency_slot)
    return state


@pytest.mark.parametrize("text", ["5", " 5", "12", "3.", "3.5", "1,496", "1,2,3", "12%", "12.5%", "-5", "−5", "(5)"])
def test_plain_numbers_are_complete(text):
    assert accepts(text)
    assert accepts(text, currency_slot=False)


def test_the_spec_example_one_token_at_a_time():
    pieces = ["(", "1", ",", "4", "9", "6", ".", "5", " million", ")"]
    state = tokens(*pieces)
    assert state == State(phase=Phase.CLOSED, bracket=False, negative=True)
    assert complete(state)
    assert not complete(tokens(*pieces[:-1]))  # the bracket is still open


def test_the_leading_space_once_and_only_first():
    assert accepts(" 5")
    assert feed(START, "  5", True) is None
    assert feed(START, "5 ", True) is None
    assert feed(START, "- 5", True) is None  # no space after a sign
    assert accepts(" -5")


@pytest.mark.parametrize("text", ["--5", "-−5", "(-5)", "-(5)", "((5))", "−(5"])
def test_at_most_one_sign(text):
    assert feed(START, text, True) is None


def test_a_minus_sign_is_negative_and_an_open_bracket_never_completes():
    assert tokens("-").negative and tokens("−").negative
    assert tokens("(").bracket and tokens("(").negative
    for text in ["(168", "(1.", "(1.5", "(12%", "(5,", "($5"]:
        assert feed(START, text, True) is not None
        assert not accepts(text)
    assert accepts("(12%)") and accepts("(1.5)")
    assert tokens("(168", " million", ")") == State(phase=Phase.CLOSED, negative=True)


def test_a_closing_bracket_needs_an_open_one_and_ends_the_number():
    assert feed(START, "5)", True) is None
    assert feed(START, "(5))", True) is None
    assert feed(START, "(5)5", True) is None
    assert feed(START, "(5.)", True) is None  # after the dot only a digit


@pytest.mark.parametrize("symbol", list("$€£¥"))
def test_currency_only_in_currency_slots(symbol):
    assert accepts(symbol + "5")
    assert feed(START, symbol, False) is None
    assert accepts(" " + symbol + "5") and accepts("-" + symbol + "5") and accepts("(" + symbol + "5)")
    assert accepts(symbol + " 5") and accepts(" " + symbol + " 5")
    assert feed(START, symbol + "  5", True) is None  # exactly one space after it
    assert feed(START, symbol + "-5", True) is None  # the sign comes first
    assert feed(START, symbol + "$5", True) is None  # one currency symbol
    assert feed(START, "5" + symbol, True) is None
    assert tokens(symbol).currency and tokens(symbol).phase is Phase.PRE


def test_comma_then_digit_only():
    assert feed(START, "1, 2", True) is None
    assert feed(START, "1,,2", True) is None
    assert feed(START, "1,.5", True) is None
    assert feed(START, ",5", True) is None
    assert not accepts("1,")
    assert accepts("1,2,3") and accepts("12,3456")  # group sizes are not checked


def test_dot_and_fraction():
    assert accepts("3.")  # a sentence-final period
    assert feed(START, "3..", True) is None
    assert feed(START, "3.5.1", True) is None
    assert feed(START, "3.5,1", True) is None
    assert feed(START, "3.%", True) is None
    assert feed(START, ".5", True) is None
    assert accepts("3.25")


@pytest.mark.parametrize("word", [" thousand", " million", " billion"])
def test_scale_words_only_as_whole_tokens_after_digits(word):
    assert complete(tokens("3", word)) and complete(tokens("3.5", word))
    assert tokens("3", word).phase is Phase.POST
    assert tokens(word) is None and tokens("3.", word) is None and tokens("1,", word) is None
    assert tokens("3", word, word) is None and tokens("3%", word) is None and tokens("3", word, "5") is None
    assert feed(START, "3" + word, True) is None  # inside a longer token its letters are not allowed
    assert feed(tokens("3"), word.strip(), True) is None  # without its leading space
    assert step(tokens("3"), word.strip(), True) is None


def test_percent_and_post():
    assert accepts("12%") and accepts("(12%)")
    assert feed(START, "12%%", True) is None
    assert feed(START, "12%5", True) is None
    assert feed(START, "%", True) is None


def test_closed_takes_nothing():
    closed = tokens("(5)")
    for char in " 0123456789.,%()-−$€£¥":
        assert step(closed, char, True) is None
    assert step(closed, " million", True) is None


def test_feed_chains_through_none_and_an_empty_text_changes_nothing():
    assert feed(None, "5", True) is None
    assert feed(tokens("(5"), "", True) == tokens("(5")


# The independent formulation: complete numbers as one regular expression per slot kind, the scale word written
# out. `@` stands for " million" so that the alphabet below is one character per symbol.
def _complete_regex(currency_slot):
    cur = r"(?:[$€£¥] ?)?" if currency_slot else ""
    integer = r"\d(?:,?\d)*"
    tail = r"(?:\.\d+)?(?:%|@)?"
    return re.compile(rf" ?(?:[-−]?{cur}{integer}(?:\.|{tail})|\({cur}{integer}{tail}\))")


# Every viable prefix of the language becomes complete after one of these (shortest completions of every phase).
_COMPLETIONS = ("", "7", ")", "7)")
_ALPHABET = " 7,.%()-−$€@"


@pytest.mark.parametrize("currency_slot", [True, False])
def test_the_grammar_equals_an_independent_regex_on_every_short_string(currency_slot):
    regex = _complete_regex(currency_slot)
    checked = 0
    for length in range(6):
        for symbols in itertools.product(_ALPHABET, repeat=length):
            text = "".join(symbols)
            state = START
            for symbol in symbols:
                state = None if state is None else step(state, " million" if symbol == "@" else symbol, currency_slot)
            assert complete(state) == bool(regex.fullmatch(text)), text
            viable = any(regex.fullmatch(text + end) for end in _COMPLETIONS)
            assert (state is not None) == viable, text
            checked += 1
    assert checked > 100_000


def test_feed_agrees_with_step_by_step():
    for text in ["(1,496.5", " $ 12", "−7.", "12%)", "1, 2", "¥(5"]:
        state = START
        for char in text:
            state = None if state is None else step(state, char, True)
        assert feed(START, text, True) == state
