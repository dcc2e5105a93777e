"""The kinds of setting values: how text (a flag, a ``SPINF_*`` variable) and native values (TOML, a manifest)
become a checked setting value, how a value is written back to TOML, and what a kind allows.

Each kind raises ``Refused`` with the problem alone; ``spinf.settings`` adds the setting's dotted name, where the
value came from and what is allowed, so every refusal reads the same. Environment rules (api spec §9.1): booleans are
true for 1/true/yes/on, case-insensitive, and false for anything else; numbers are parsed; lists are split on a
separator. TOML values must have the right TOML type, except that a list may also be a separated string. The media
kinds also take the reference's booleans (api spec §9.1, drop-in): false for none, true for every kind the model reads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Protocol

import attrs

MEDIA_KINDS = ("image", "audio", "video")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class Refused(Exception):
    """A value a kind does not accept; the message says what is wrong with it."""


class Kind(Protocol):
    def from_text(self, text: str) -> object: ...

    def from_value(self, value: object) -> object: ...

    def to_toml(self, value: object) -> object: ...

    def allowed(self) -> str: ...


@attrs.frozen
class Text:
    """A string, optionally one of ``choices`` (``aliases`` map other spellings onto a choice) or a full match of
    ``pattern``; ``what`` describes the allowed values when the default description would be unclear."""

    choices: tuple[str, ...] = ()
    aliases: Mapping[str, str] = attrs.field(factory=dict)
    pattern: str | None = None
    what: str = ""
    empty: bool = True

    def from_text(self, text: str) -> str:
        text = self.aliases.get(text, text)
        if self.choices and text not in self.choices:
            raise Refused(f"{text!r} is not one of the choices")
        if self.pattern and not re.fullmatch(self.pattern, text):
            raise Refused(f"{text!r} does not fit")
        if not self.empty and not text.strip():
            raise Refused("it is empty")
        return text

    def from_value(self, value: object) -> str:
        if not isinstance(value, str):
            raise Refused(f"{value!r} is not a string")
        return self.from_text(value)

    def to_toml(self, value: object) -> object:
        return value

    def allowed(self) -> str:
        if self.what:
            return self.what
        if self.choices:
            return ", ".join(self.choices)
        return "a non-empty string" if not self.empty else "a string"


@attrs.frozen
class Integer:
    """An integer from ``low`` to ``high`` (None: no bound); with ``multiple``, rounded up to a multiple of it."""

    low: int | None
    high: int | None = None
    multiple: int = 1

    def from_text(self, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise Refused(f"{text!r} is not an integer") from None
        return self.from_value(value)

    def from_value(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(f"{value!r} is not an integer")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise Refused(f"{value} is out of range")
        return -(-value // self.multiple) * self.multiple

    def to_toml(self, value: object) -> object:
        return value

    def allowed(self) -> str:
        if self.low is None:
            return "an integer"
        span = f"from {self.low} to {self.high}" if self.high is not None else f"of at least {self.low}"
        rounding = f", rounded up to a multiple of {self.multiple}" if self.multiple > 1 else ""
        return f"an integer {span}{rounding}"


@attrs.frozen
class Number:
    """A finite number of at least ``low`` (above ``low`` when not ``inclusive``; None: any finite number)."""

    low: float | None
    inclusive: bool = True

    def from_text(self, text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise Refused(f"{text!r} is not a number") from None
        return self.from_value(value)

    def from_value(self, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise Refused(f"{value!r} is not a finite number")
        if self.low is not None and (value < self.low or (value == self.low and not self.inclusive)):
            raise Refused(f"{value} is out of range")
        return float(value)

    def to_toml(self, value: object) -> object:
        return value

    def allowed(self) -> str:
        if self.low is None:
            return "a finite number"
        return f"a number {'of at least' if self.inclusive else 'greater than'} {self.low:g}"


@attrs.frozen
class Switch:
    """A boolean; as text, true for 1/true/yes/on and false for anything else (api spec §9.1)."""

    def from_text(self, text: str) -> bool:
        return text.strip().lower() in _TRUE

    def from_value(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise Refused(f"{value!r} is not true or false")
        return value

    def to_toml(self, value: object) -> object:
        return value

    def allowed(self) -> str:
        return "true or false (as text: 1, true, yes or on for true, anything else for false)"


@attrs.frozen
class Words:
    """A list of strings: a list, or text split on ``sep`` (blank items dropped). Stored as a tuple."""

    sep: str = ","

    def from_text(self, text: str) -> tuple[str, ...]:
        return tuple(item.strip() for item in text.split(self.sep) if item.strip())

    def from_value(self, value: object) -> tuple[str, ...]:
        if isinstance(value, str):
            return self.from_text(value)
        if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
            raise Refused(f"{value!r} is not a list of strings")
        return tuple(item.strip() for item in value if item.strip())

    def to_toml(self, value: object) -> object:
        return list(value)

    def allowed(self) -> str:
        return f"a list of strings (an array, or one string separated by {self.sep!r})"


@attrs.frozen
class Media:
    """The media kinds: ``image``, ``audio``, ``video`` (comma-separated as text), or ``none`` alone for no kind.
    An empty list means none too (a manifest of a text-only model says ``media = []``); empty text does not.

    The reference's booleans are read too (its ``SPINF_MEDIA`` and ``load_media`` loaded the embedders or not):
    false (``0``, ``false``, ``no``, ``off``, TOML ``false``) is none; true is every kind, and `defers` says so, since
    it chooses no kinds of its own: the layers and names below it may still narrow them (``media_kinds``)."""

    def from_text(self, text: str) -> frozenset[str]:
        if not text.strip():
            raise Refused("it is empty (write none for no media)")
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE:
            return self.from_value(word in _TRUE)
        return self.from_value(text.split(","))

    def from_value(self, value: object) -> frozenset[str]:
        if isinstance(value, bool):
            return frozenset(MEDIA_KINDS) if value else frozenset()
        if isinstance(value, str):
            return self.from_text(value)
        items = Words().from_value(list(value) if isinstance(value, frozenset | set) else value)
        unknown = [item for item in items if item not in (*MEDIA_KINDS, "none")]
        if unknown:
            raise Refused(f"{unknown[0]!r} is not a media kind")
        if "none" in items and len(items) > 1:
            raise Refused("none cannot be combined with media kinds")
        return frozenset(item for item in items if item != "none")

    @staticmethod
    def defers(raw: object) -> bool:
        """Whether ``raw`` is the reference's true: every kind the model reads, unless something else narrows them."""
        return raw is True or (isinstance(raw, str) and raw.strip().lower() in _TRUE)

    def to_toml(self, value: object) -> object:
        return [kind for kind in MEDIA_KINDS if kind in value] or "none"

    def allowed(self) -> str:
        return "image, audio, video (comma-separated), none, or a boolean (true: the model's kinds; false: none)"
