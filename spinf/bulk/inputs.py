"""The inputs side of bulk scoring: the shared request part, the inputs file, and cutting it into batches.

The inputs file is JSON Lines: one input object per line, as in api spec §4.2, plus the convenience key ``content``
(a string or a list of content parts) that becomes ``messages: [{"role": "user", "content": ...}]`` here, the way
spinf-client does it. Whitespace-only lines are skipped; line numbers in errors count every physical line. The file
is read twice: `scan_inputs` checks every line and the ids before anything is scored (a typo on line 900,000 must
not surface after hours of work) and reports every bad line, the first `MAX_LISTED` by number and what is wrong,
then `read_items` streams it again, so memory holds ids, not inputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import attrs

from spinf.bulk.errors import BulkInputError
from spinf.settings import SETTING

# spinf-client starts a new call before 1,000,000 characters of text; we count the JSON bytes each input adds to the
# body instead (json.dumps escapes non-ASCII, so characters are bytes), which the 2 MiB body limit is about.
MAX_BATCH_BYTES = 1_000_000
MAX_BODY_BYTES = SETTING["max_body_bytes"].default  # a server's body limit unless it sets its own
_BODY_SLACK = 4096  # the envelope around the inputs: keys, brackets, commas
MAX_LISTED = 20  # bad lines named one by one in the error; the rest are counted


@attrs.frozen
class Item:
    """One input of the inputs file, ready to send."""

    index: int  # position among the file's inputs, 0-based
    line: int  # physical line number, 1-based
    id: str
    body: dict  # the api spec §4.2 input object
    size: int  # bytes it adds to a request body


@attrs.frozen
class InputIndex:
    """What the checking pass learned: every id and its line."""

    line_of: dict[str, int]

    @property
    def total(self) -> int:
        return len(self.line_of)


def read_json_object(path: str | Path, what: str) -> dict:
    """A JSON file that must hold one object."""
    try:
        value = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise BulkInputError(f"cannot read the {what} {str(path)!r}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise BulkInputError(f"the {what} {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BulkInputError(f"the {what} {str(path)!r} must hold a JSON object, not {type(value).__name__}")
    return value


def describe_request(argument: str | Path) -> str:
    """How errors name ``score``'s REQUEST argument: stdin (``-``), inline JSON (it starts with ``{``) or a file."""
    argument = str(argument)
    if argument == "-":
        return "the request on stdin"
    if argument.lstrip().startswith("{"):
        return "the inline request"
    return f"the request file {argument!r}"


def read_request(argument: str | Path, stdin: BinaryIO) -> dict:
    """``score``'s REQUEST: ``-`` reads the body from ``stdin``, an argument starting with ``{`` is the body itself,
    anything else names a file (a file whose name starts with ``{`` is read as ``./{...``)."""
    argument = str(argument)
    if argument != "-" and not argument.lstrip().startswith("{"):
        return read_json_object(argument, "request file")
    what = describe_request(argument)
    try:
        value = json.loads(stdin.read() if argument == "-" else argument)
    except ValueError as exc:
        raise BulkInputError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BulkInputError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def check_shared(request: dict, source: str = "the request") -> None:
    """The shared part of a bulk body must not hold inputs of its own."""
    for key in ("inputs", "messages"):
        if key in request:
            raise BulkInputError(
                f"{source} holds {key!r}: with --inputs, the request file holds only the part shared by every input "
                "(scoring, and optionally model and endpoint); the inputs go in the inputs file, one per line"
            )


def batch_budget(request: dict, max_batch_bytes: int = MAX_BATCH_BYTES) -> int:
    """The bytes of inputs one body may carry so that the whole body stays under the server's body limit."""
    shared = len(json.dumps(request))
    budget = min(max_batch_bytes, MAX_BODY_BYTES - shared - _BODY_SLACK)
    if budget <= 0:
        raise BulkInputError(
            f"the shared request part alone is {shared:,} bytes of JSON; a body must stay under {MAX_BODY_BYTES:,}"
        )
    return budget


class _BadLine(ValueError):
    """What is wrong with one line; `read_items` and `scan_inputs` add the file and the line number."""


def _item(raw: bytes, line: int, index: int) -> Item:
    try:
        obj = json.loads(raw.rstrip())  # without its line break, a JSON error's column is the line's
    except json.JSONDecodeError as exc:
        raise _BadLine(f"not valid JSON ({exc.msg} at column {exc.colno})") from exc
    except ValueError as exc:  # bytes that are not UTF-8
        raise _BadLine(f"not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise _BadLine(f"an input must be a JSON object, not {type(obj).__name__}")
    input_id = obj.get("id")
    if not isinstance(input_id, str):
        raise _BadLine(f"'id' must be a string, got {json.dumps(input_id)}")
    if ("content" in obj) == ("messages" in obj):
        raise _BadLine("give exactly one of 'content' (a string or content parts) and 'messages'")
    body = {"id": input_id}
    if "content" in obj:
        if not isinstance(obj["content"], str | list):
            raise _BadLine("'content' must be a string or a list of content parts")
        body["messages"] = [{"role": "user", "content": obj["content"]}]
    body.update((k, v) for k, v in obj.items() if k not in ("id", "content"))
    return Item(index, line, input_id, body, len(json.dumps(body)) + 1)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of every line that is not blank."""
    try:
        file = path.open("rb")
    except OSError as exc:
        raise BulkInputError(f"cannot read the inputs file {str(path)!r}: {exc.strerror or exc}") from exc
    with file:
        yield from ((line, raw) for line, raw in enumerate(file, 1) if raw.strip())


def read_items(path: str | Path) -> Iterator[Item]:
    """The inputs of a JSON Lines file, in order; a bad line raises `BulkInputError` naming it."""
    path = Path(path)
    for index, (line, raw) in enumerate(_lines(path)):
        try:
            yield _item(raw, line, index)
        except _BadLine as exc:
            raise BulkInputError(f"{path} line {line}: {exc}") from exc


def scan_inputs(path: str | Path) -> InputIndex:
    """Checks every line and that ids are unique; an empty file is an error too.

    Every bad line counts, and the error names the first `MAX_LISTED` of them (a single one as ``<file> line
    <n>: <problem>``, several one per line under a count) and then how many more there are.
    """
    path = Path(path)
    line_of: dict[str, int] = {}
    listed: list[str] = []
    num_bad = 0
    for index, (line, raw) in enumerate(_lines(path)):
        try:
            item = _item(raw, line, index)
        except _BadLine as exc:
            problem = str(exc)
        else:
            first = line_of.setdefault(item.id, line)
            problem = None if first == line else f"input id {item.id!r} is already on line {first}"
        if problem is not None:
            num_bad += 1
            if len(listed) < MAX_LISTED:
                listed.append(f"line {line}: {problem}")
    if num_bad == 1:
        raise BulkInputError(f"{path} {listed[0]}")
    if num_bad:
        more = [f"and {num_bad - len(listed):,} more"] if num_bad > len(listed) else []
        raise BulkInputError("\n  ".join([f"{path}: {num_bad:,} bad lines, nothing was scored:", *listed, *more]))
    if not line_of:
        raise BulkInputError(f"the inputs file {str(path)!r} holds no input")
    return InputIndex(line_of)


def batches(items: Iterable[Item], batch_size: int, max_bytes: int) -> Iterator[list[Item]]:
    """Consecutive items, at most ``batch_size`` and ``max_bytes`` per batch; a larger single item goes alone."""
    batch: list[Item] = []
    size = 0
    for item in items:
        if batch and (len(batch) >= batch_size or size + item.size > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item.size
    if batch:
        yield batch
