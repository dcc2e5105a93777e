"""Ordering a pack's versions and choosing its default version (packs spec §1.2).

A version is an opaque string. Without a repository manifest the versions of an id are sorted newest first: split on
``.``, ``+`` and ``-``, all-digit parts compare as integers and other parts as strings, part by part, and a version
that is a prefix of another is older (``1.10.0`` before ``1.9.0``). Where a number part meets a text part at the
first position that differs (``1.0.1`` against ``1.0.rc1``) the two cannot be ordered: `newest_first` raises
`UnorderableVersions`, which refuses the catalog build.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Sequence

_SEPARATORS = re.compile(r"[.+-]")


class UnorderableVersions(ValueError):
    """Two versions whose first differing parts are a number and a text."""


def _parts(version: str) -> list[int | str]:
    return [int(part) if part.isdigit() and part.isascii() else part for part in _SEPARATORS.split(version)]


def compare(a: str, b: str) -> int:
    """Negative when ``a`` is older than ``b``, 0 when they order alike, positive when newer."""
    for x, y in zip(_parts(a), _parts(b), strict=False):
        if x == y:
            continue
        if isinstance(x, int) != isinstance(y, int):
            raise UnorderableVersions(f"the versions {a!r} and {b!r} cannot be ordered: {x!r} against {y!r}")
        return -1 if x < y else 1
    return len(_parts(a)) - len(_parts(b))


def newest_first(versions: Sequence[str]) -> list[str]:
    """``versions`` sorted newest first (stable for versions that order alike); every pair is checked first, so
    whether a set can be ordered does not depend on the sort's comparisons."""
    for a, b in itertools.combinations(versions, 2):
        compare(a, b)
    return sorted(versions, key=functools.cmp_to_key(compare), reverse=True)


def default_version(versions: Sequence[tuple[str, str]], *, listed: bool) -> str:
    """The default of ``(version, status)`` pairs in their order: with a manifest (``listed``), the first available
    version, else the first listed; without one, the newest."""
    if listed:
        return next((version for version, status in versions if status == "available"), versions[0][0])
    return newest_first([version for version, _ in versions])[0]
