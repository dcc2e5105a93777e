"""The served model's names as a JSON Schema pattern, compared as the parser compares a request's ``model``.

`spinf.protocol.request` takes a ``model`` when its `str.casefold` is one of the served names' casefolds (api spec
§4.12 step 4). `casefold_pattern` writes exactly that set of strings as one pattern for the OpenAPI document, which
ECMA-262 and Python read alike: every character that folds to a name's character (``K``, the Kelvin sign ``\u212a``
and ``k`` for ``k``), and every one that folds to two or three of them (``ß`` for ``ss``, the ligature ``\ufb01``
for ``fi``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable


def casefold_pattern(names: Iterable[str], limit: int = 4096) -> str | None:
    """A pattern of exactly the strings whose casefold is one of ``names``' casefolds; None when one name's part
    would pass ``limit`` characters (a name full of foldable pairs, each of which doubles what follows it)."""
    parts = [_folding_to(folded, limit) for folded in dict.fromkeys(name.casefold() for name in names)]
    if not parts or None in parts:
        return None
    return f"^(?:{'|'.join(parts)})$(?!\\n)"  # the lookahead: Python's $ also matches before a final newline


@functools.cache
def _folded_from() -> dict[str, str]:
    """Each casefold that some other character has, and those characters: ``"k"`` -> ``"\u212a"`` (Kelvin)."""
    sources: dict[str, str] = {}
    for code in range(sys.maxunicode + 1):
        folded = chr(code).casefold()
        if folded != chr(code):
            sources[folded] = sources.get(folded, "") + chr(code)
    return sources


def _escaped(char: str) -> str:
    """``char`` for a pattern that ECMA-262 and Python read alike: ASCII letters and digits as they are."""
    if char.isascii() and char.isalnum():
        return char
    return f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else char


def _folding_to(text: str, limit: int) -> str | None:
    """A regex of exactly the strings whose casefold is ``text``, a casefolded name; None past ``limit`` characters."""
    sources = _folded_from()

    def rest(i: int) -> str:
        if i == len(text):
            return ""
        branches = []
        for size in (1, 2, 3):
            piece = text[i : i + size]
            chars = (piece if size == 1 and piece.casefold() == piece else "") + sources.get(piece, "")
            if len(piece) == size and chars:
                one = _escaped(chars) if len(chars) == 1 else "[" + "".join(map(_escaped, chars)) + "]"
                branches.append(one + rest(i + size))
                if sum(map(len, branches)) > limit:
                    raise OverflowError
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"

    try:
        return rest(0)
    except OverflowError:
        return None
