"""The TOML config file as text: reading it (with tomlkit) into entries that know their line, and writing one.

tomlkit keeps no line numbers on parsed values, so the lines come from a plain scan of the text for table headers
and keys; a key the scan cannot place (inside a multi-line value, an inline table) falls back to its table's line,
then to the file alone. Which keys are allowed where is ``spinf.settings``'s business, not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import attrs
import tomlkit
from tomlkit.exceptions import TOMLKitError

from spinf.errors import ConfigError

_HEADER = re.compile(r"\s*\[\[?\s*([^\[\]#]+?)\s*\]")
_KEY = re.compile(r"""\s*("[^"]*"|'[^']*'|[A-Za-z0-9_-]+)\s*[=.]""")


@attrs.frozen
class Entry:
    """One key of the file: ``section`` is None for a key outside any table; ``value`` is plain Python."""

    section: str | None
    key: str
    value: object
    origin: str


@attrs.frozen
class ConfigFile:
    path: str
    entries: tuple[Entry, ...]  # every key of every table, and every key outside a table


def read_config(path: str, given_by: str) -> ConfigFile:
    """Parse the file at ``path`` (named by ``given_by``, e.g. ``flag --config``); ``ConfigError`` if unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} ({given_by}): no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} ({given_by}): cannot be read: {exc}") from None
    try:
        document = tomlkit.parse(text).unwrap()
    except TOMLKitError as exc:
        line = getattr(exc, "line", None)
        where = f"{path}:{line}" if line else path
        raise ConfigError(f"config {where} ({given_by}): not valid TOML: {exc}") from None
    lines = _key_lines(text)

    def origin(section: str | None, key: str) -> str:
        line = lines.get((section, key)) or lines.get((None, section))
        return f"config {path}:{line}" if line else f"config {path}"

    entries = []
    for name, value in document.items():
        if isinstance(value, dict):
            entries += [Entry(name, key, item, origin(name, key)) for key, item in value.items()]
        else:
            entries.append(Entry(None, name, value, origin(None, name)))
    return ConfigFile(path, tuple(entries))


def _key_lines(text: str) -> dict[tuple[str | None, str], int]:
    """The first line (from 1) of each ``(table, key)``, and of each table as ``(None, table)``."""
    lines: dict[tuple[str | None, str], int] = {}
    table: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if header := _HEADER.match(line):
            table = ".".join(part.strip().strip("\"'") for part in header.group(1).split("."))
            first, _, rest = table.partition(".")
            lines.setdefault((None, first), number)
            if rest:
                lines.setdefault((first, rest.partition(".")[0]), number)
        elif key := _KEY.match(line):
            lines.setdefault((table, key.group(1).strip("\"'")), number)
    return lines


def write_config(sections: Iterable[tuple[str, Iterable[tuple[str, object, str, bool]]]], header: str) -> str:
    """A commented TOML file: for each section, each ``(key, value, comment, live)``; a key that is not ``live``
    is written commented out, so reading the file back leaves it to the lower layers."""
    document = tomlkit.document()
    for line in header.splitlines():
        document.add(tomlkit.comment(line))
    for section, rows in sections:
        table = tomlkit.table()
        for key, value, comment, live in rows:
            table.add(tomlkit.comment(comment))
            if live:
                table.add(key, value)
            else:
                table.add(tomlkit.comment(f"{key} = {tomlkit.item(value).as_string()}"))
        document.add(tomlkit.nl())
        document.add(section, table)
    return tomlkit.dumps(document)
