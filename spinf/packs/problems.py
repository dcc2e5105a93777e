"""A validation problem (packs spec §8): where in a file it is and what is wrong, collected rather than raised.

Pack files and repository manifests are checked in full so that an author sees every problem at once. A check
appends `Problem` values to a `Problems` list; the path is the dotted JSON path inside the file (``reads.2.sd``,
``categories.rudeness.platt``), empty for the file as a whole.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Problem:
    """``path`` is the JSON path inside ``file``; ``file`` is set where a folder is scanned (relative to it)."""

    path: str
    message: str
    file: str = ""

    def render(self) -> str:
        """One line: ``file: path: message``, the parts that are empty left out."""
        return ": ".join(part for part in (self.file, self.path, self.message) if part)

    def in_file(self, file: str) -> Problem:
        return attrs.evolve(self, file=file)


@attrs.define
class Problems:
    """The problems found so far, in the order the checks ran."""

    items: list[Problem] = attrs.field(factory=list)

    def add(self, path: str, message: str, file: str = "") -> None:
        self.items.append(Problem(path, message, file))

    def __len__(self) -> int:
        return len(self.items)


def is_number(value: object) -> bool:
    """A JSON integer or float, never a boolean (§1.1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)
