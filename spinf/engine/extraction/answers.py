"""What a searched or generated slot returns (engine spec A.12.5, A.13; api spec §5.2, §5.4, §5.5), pure Python.

A search finds answers as decoded strings with log-probabilities, often the same answer several times (other
token paths, other spellings); this module trims, parses and merges them into a combination's fields:
``answers`` best first, ``mass``, and for number slots ``p_negative``, with ``p_calibrated`` when the query sent a
calibration. A generated slot's texts are finished here too (trimmed, the stop quote removed). Sums use `math.fsum`,
so a result does not depend on the order in which the search recorded its answers.

Ties, which the spec leaves open: merged answers of equal probability are ordered by their text in code-point
order, and a group's shown spelling is its most probable surface form (a form's probability summed over the token
paths that gave it), the text in code-point order breaking a tie.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import attrs

from spinf.engine.extraction.grammar import CURRENCY_SYMBOLS, SCALE_WORDS
from spinf.packs.pipeline import sigmoid

KINDS = ("text", "number", "currency")  # the `kind` of `{*}`, `{n}`, `{$}` slots
_ARTICLES = frozenset({"a", "an", "the"})
# A closing quote of the stop text also matches its typographic twin, and the twin the quote (A.12.2).
_QUOTE_TWINS = {'"': "”", "”": '"', "'": "’", "’": "'"}
_MAGNITUDE = re.compile(r"\d[\d,]*(\.\d+)?")
_NEGATIVE = re.compile(r"\s*[$€£¥]?\s*[-−(]")
_SCALES = tuple(zip(SCALE_WORDS, (1e3, 1e6, 1e9), strict=True))  # " thousand", " million", " billion"
_P_CLAMP = 1e-9
_ABS_TOLERANCE = 1e-9  # relative, for p_negative's "same absolute value as the top answer"


def stop_characters(stop_text: str) -> str:
    """The characters that end a `{*}` slot with this stop text: its first character and that character's quote
    twin; "" when the slot has no stop text."""
    first = stop_text[:1]
    return first + _QUOTE_TWINS[first] if first in _QUOTE_TWINS else first


def text_key(text: str) -> str:
    """The merging key of text answers: lower-cased, punctuation (Unicode's and ASCII's, typographic quotes and
    dashes included) turned into spaces, the articles a/an/the dropped as words, whitespace removed."""
    spaced = "".join(" " if _is_punctuation(char) else char for char in text.lower())
    return "".join(word for word in spaced.split() if word not in _ARTICLES)


def parse_value(text: str) -> float | None:
    """A number answer's value, or None when it has no digits. The first `\\d[\\d,]*(\\.\\d+)?`, commas removed,
    times 10³/10⁶/10⁹ when ` thousand`/` million`/` billion` follows it, kept as is before `%`; negative when the
    text starts with `-`, `−` or `(` after leading spaces and a currency symbol."""
    match = _MAGNITUDE.search(text)
    if match is None:
        return None
    value = float(match.group().replace(",", ""))
    rest = text[match.end() :]
    value *= next((factor for word, factor in _SCALES if rest.startswith(word)), 1.0)
    return -value if _NEGATIVE.match(text) else value


def currency_of(text: str) -> str | None:
    """The first currency symbol in a `{$}` answer, or None."""
    return next((char for char in text if char in CURRENCY_SYMBOLS), None)


def searched_combination(
    kind: str,
    values: dict[str, str],
    found: Iterable[tuple[str, float]],
    top_k: int = 5,
    calibration: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """One combination of a searched slot: ``{values, answers, mass}`` plus ``p_negative`` (number and currency
    slots with an answer) and ``p_calibrated`` (``calibration`` = (a, b) sent and an answer). ``found``: every
    answer the search recorded, as (decoded tokens, log-prob), duplicates included."""
    if kind not in KINDS:
        raise ValueError(f"unknown slot kind {kind!r}")
    answers = [(text.strip(), math.exp(logprob)) for text, logprob in found]
    if kind != "text":
        answers = [(text, p) for text, p in answers if parse_value(text) is not None]
    groups = _merge(answers, text_key if kind == "text" else _number_key(kind))
    result: dict[str, Any] = {
        "values": values,
        "answers": [_answer(kind, text, p) for text, p in groups[:top_k]],
        "mass": round(math.fsum(p for _, p in answers), 6) if answers else 0,
    }
    if groups and kind != "text":
        result["p_negative"] = _p_negative(groups)
    if groups and calibration is not None:
        result["p_calibrated"] = round(_calibrated(groups[0][1], *calibration), 6)
    return result


@attrs.frozen
class Generated:
    """One generated sequence: ``text`` the decode of its tokens, ``last_token`` the last token decoded alone
    ("" with no token), ``finish`` "stop" (the end event was chosen) or "length" (``max_tokens`` reached)."""

    text: str
    last_token: str
    finish: str = attrs.field(validator=attrs.validators.in_(("stop", "length")))


def finish_text(text: str, last_token: str, stop_text: str) -> str:
    """A generated text as returned (A.13, api spec §5.5). When the stop text opens with a quote (`"`, `'`, or a
    Unicode initial or final quote such as `”`) and that quote or its twin ended up inside the last token, the text
    is cut there, dropping the quote and what followed it in that token; then it is trimmed and trailing copies of
    the quote are removed. The cut needs the last token's text at the end of ``text`` (a character split over tokens
    decodes differently alone; then only trailing copies are removed). Other stop characters change nothing: a
    letter or a space inside a token is part of the answer."""
    quotes = stop_characters(stop_text) if _is_quote(stop_text[:1]) else ""
    if quotes and last_token and text.endswith(last_token):
        cuts = [last_token.index(char) for char in quotes if char in last_token]
        if cuts:
            text = text[: len(text) - len(last_token) + min(cuts)]
    return text.strip().rstrip(quotes).strip()


def generated_combination(values: dict[str, str], sequences: Iterable[Generated], stop_text: str) -> dict[str, Any]:
    """One combination of a generated slot: ``{values, answers}``, the answers ``{text, finish}`` in sequence
    order."""
    answers = [{"text": finish_text(s.text, s.last_token, stop_text), "finish": s.finish} for s in sequences]
    return {"values": values, "answers": answers}


def _is_punctuation(char: str) -> bool:
    return char in string.punctuation or unicodedata.category(char).startswith("P")


def _is_quote(char: str) -> bool:
    return char in ("'", '"') or (char != "" and unicodedata.category(char) in ("Pi", "Pf"))


def _number_key(kind: str) -> Callable[[str], Hashable]:
    def key(text: str) -> Hashable:
        value = parse_value(text)
        return round(value, 9), currency_of(text) if kind == "currency" else None

    return key


def _merge(answers: list[tuple[str, float]], key: Callable[[str], Hashable]) -> list[tuple[str, float]]:
    """(shown text, summed p) per key, best first."""
    forms: dict[Hashable, dict[str, list[float]]] = {}
    for text, p in answers:
        forms.setdefault(key(text), {}).setdefault(text, []).append(p)
    groups = []
    for spellings in forms.values():
        form_p = {text: math.fsum(ps) for text, ps in spellings.items()}
        shown = min(form_p, key=lambda text: (-form_p[text], text))
        groups.append((shown, math.fsum(p for ps in spellings.values() for p in ps)))
    return sorted(groups, key=lambda group: (-group[1], group[0]))


def _answer(kind: str, text: str, p: float) -> dict[str, Any]:
    answer: dict[str, Any] = {"text": text, "p": round(p, 6)}
    if kind != "text":
        answer["value"] = parse_value(text)
    if kind == "currency":
        answer["currency"] = currency_of(text)
    return answer


def _p_negative(groups: list[tuple[str, float]]) -> float | None:
    """Among the merged answers whose absolute value is the top answer's, the share of p held by negative values."""
    valued = [(parse_value(text), p) for text, p in groups]
    top = abs(valued[0][0])
    same = [(value, p) for value, p in valued if abs(abs(value) - top) <= _ABS_TOLERANCE * top]
    total = math.fsum(p for _, p in same)
    if total == 0:
        return None
    return round(math.fsum(p for value, p in same if value < 0) / total, 6)


def _calibrated(p_top: float, a: float, b: float) -> float:
    p = min(max(p_top, _P_CLAMP), 1 - _P_CLAMP)
    return sigmoid(a * math.log(p / (1 - p)) + b)
