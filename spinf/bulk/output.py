"""The output side of bulk scoring: result lines, the append-only writer, and reading a previous run back.

**Format.** JSON Lines, UTF-8, one line per input, in input order::

    {"input_id": "a", "queries": [...]}
    {"input_id": "b", "queries": [...], "packs": [...], "warnings": [{"code": "low_option_mass", ...}]}

Each line is the response's ``results[i]`` for that input exactly as the server or engine returned it (api spec
§5.2; ``packs`` only when the call had packs), plus ``warnings`` (§5.6) when any belong to that input: those naming
it by ``input_id``, and those naming it by ``param``. A ``param`` counts inputs over the whole inputs file
(``inputs.<k>`` is the file's k-th input, 0-based), as if the file were one call. Warnings naming no input are
logged. A line is only ever written whole: one ``write`` of the encoded line, then a flush; the file is fsynced when
the writer closes. A crash between a write's first and last byte can still leave a partial last line; `read_done`
cuts it before a resumed run appends.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from spinf.bulk.errors import BulkError, BulkInputError, batch_param
from spinf.bulk.inputs import InputIndex, Item

logger = logging.getLogger(__name__)
_CHUNK = 1 << 16


def dumps(value: object) -> str:
    """Compact JSON that keeps non-ASCII text readable, escaped only where it cannot be UTF-8 (lone surrogates)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"))
    return text


def _warnings_by_input(batch: list[Item], warnings: list) -> dict[str, list[dict]]:
    ids = {item.id for item in batch}
    found: dict[str, list[dict]] = {}
    for warning in warnings:
        if not isinstance(warning, dict):
            continue
        param, item = batch_param(warning.get("param"), batch)
        if item is not None:
            found.setdefault(item.id, []).append({**warning, "param": param})
        elif warning.get("input_id") in ids:
            found.setdefault(warning["input_id"], []).append(warning)
        else:
            logger.warning("a warning for no single input of the batch at line %d: %s", batch[0].line, warning)
    return found


def result_lines(batch: list[Item], response: dict) -> list[bytes]:
    """The encoded output lines of a batch from the scorer's response; a response that does not fit raises."""
    results = response.get("results") if isinstance(response, dict) else None
    if not isinstance(results, list) or len(results) != len(batch):
        count = len(results) if isinstance(results, list) else "no"
        raise BulkError(
            f"the scorer answered {count} results for a batch of {len(batch)} inputs "
            f"(starting at input {batch[0].id!r}, line {batch[0].line})"
        )
    warnings = _warnings_by_input(batch, response.get("warnings") or [])
    lines = []
    for item, result in zip(batch, results, strict=True):
        if not isinstance(result, dict) or result.get("input_id") != item.id:
            raise BulkError(f"the scorer's result for input {item.id!r} (line {item.line}) names another input")
        line = dict(result)
        if item.id in warnings:
            line["warnings"] = warnings[item.id]
        lines.append((dumps(line) + "\n").encode("utf-8"))
    return lines


def _cut_partial_line(file) -> int:
    """Truncates the file after its last newline; returns how many bytes were cut."""
    size = file.seek(0, os.SEEK_END)
    end = size
    while end > 0:
        start = max(0, end - _CHUNK)
        file.seek(start)
        newline = file.read(end - start).rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    if end < size:
        file.truncate(end)
        file.flush()
        os.fsync(file.fileno())
    return size - end


def read_done(path: str | Path, index: InputIndex) -> set[str]:
    """The ids a previous run wrote, after cutting a partial last line. A foreign or repeated id is an error."""
    path = Path(path)
    if not path.exists():
        return set()
    done: dict[str, int] = {}
    with path.open("r+b") as file:
        cut = _cut_partial_line(file)
        if cut:
            logger.warning("%s: cut a partial last line of %d bytes left by an interrupted run", path, cut)
        file.seek(0)
        for line, raw in enumerate(file, 1):
            if not raw.strip():
                continue
            try:
                input_id = json.loads(raw).get("input_id")
            except (ValueError, AttributeError) as exc:
                raise BulkInputError(f"{path} line {line}: not a result line of spinf-serve score") from exc
            if input_id not in index.line_of:
                raise BulkInputError(f"{path} line {line}: input id {input_id!r} is not in the inputs file")
            if done.setdefault(input_id, line) != line:
                raise BulkInputError(f"{path}: input id {input_id!r} is on line {done[input_id]} and line {line}")
    return set(done)


def check_fresh(path: str | Path) -> None:
    """A run without --resume must not append to an earlier run's results."""
    path = Path(path)
    if path.exists() and path.stat().st_size > 0:
        raise BulkInputError(f"the output file {str(path)!r} is not empty: pass --resume to continue it, or remove it")


class OutputWriter:
    """Appends whole lines, flushing each; fsyncs on close. Use as a context manager. ``num_lines`` counts the lines
    written, also when an exception (Ctrl-C) stops `write` between two lines of a batch."""

    def __init__(self, path: str | Path):
        try:
            self._file = Path(path).open("ab")
        except OSError as exc:
            raise BulkInputError(f"cannot write the output file {str(path)!r}: {exc.strerror or exc}") from exc
        self.num_lines = 0

    def write(self, lines: list[bytes]) -> None:
        for line in lines:
            self._file.write(line)
            self._file.flush()
            self.num_lines += 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> OutputWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
