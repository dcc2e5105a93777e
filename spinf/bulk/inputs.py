"""The inputs side of bulk scoring: the shared request part, the inputs file, and cutting it into batches.

The inputs file is JSON Lines: one input object per line, as in api spec §4.2, plus the convenience key ``content``
(a string or a list of content parts) that becomes ``messages: [{"role": "user", "content": ...}]`` here, the way
spinf-client does it. Whitespace-only lines are skipped; line numbers in errors count every physical line. The file
is read twice: `scan_inputs` checks every line and the ids before anything is scored (a typo on line 900,000 must
not surface after hours of work), then `read_items` streams it again, so memory holds ids, not inputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

from spinf.bulk.errors import BulkInputError

# spinf-client starts a new call before 1,000,000 characters of text; we count the JSON bytes each input adds to the
# body instead (json.dumps escapes non-ASCII, so characters are bytes), which the 2 MiB body limit is about.
MAX_BATCH_BYTES = 1_000_000
MAX_BODY_BYTES = 2_097_152
_BODY_SLACK = 4096  # the envelope around the inputs: keys, brackets, commas


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


def _fail(path: Path, line: int, problem: str) -> BulkInputError:
    return BulkInputError(f"{path} line {line}: {problem}")


def _item(raw: bytes, path: Path, line: int, index: int) -> Item:
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise _fail(path, line, f"not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise _fail(path, line, f"an input must be a JSON object, not {type(obj).__name__}")
    input_id = obj.get("id")
    if not isinstance(input_id, str):
        raise _fail(path, line, f"'id' must be a string, got {json.dumps(input_id)}")
    if ("content" in obj) == ("messages" in obj):
        raise _fail(path, line, "give exactly one of 'content' (a string or content parts) and 'messages'")
    body = {"id": input_id}
    if "content" in obj:
        if not isinstance(obj["content"], str | list):
            raise _fail(path, line, "'content' must be a string or a list of content parts")
        body["messages"] = [{"role": "user", "content": obj["content"]}]
    body.update((k, v) for k, v in obj.items() if k not in ("id", "content"))
    return Item(index, line, input_id, body, len(json.dumps(body)) + 1)


def read_items(path: str | Path) -> Iterator[Item]:
    """The inputs of a JSON Lines file, in order; a bad line raises `BulkInputError` naming it."""
    path = Path(path)
    try:
        file = path.open("rb")
    except OSError as exc:
        raise BulkInputError(f"cannot read the inputs file {str(path)!r}: {exc.strerror or exc}") from exc
    with file:
        index = 0
        for line, raw in enumerate(file, 1):
            if raw.strip():
                yield _item(raw, path, line, index)
                index += 1


def scan_inputs(path: str | Path) -> InputIndex:
    """Checks every line and that ids are unique; an empty file is an error too."""
    line_of: dict[str, int] = {}
    for item in read_items(path):
        first = line_of.setdefault(item.id, item.line)
        if first != item.line:
            raise BulkInputError(f"{path}: input id {item.id!r} is on line {first} and again on line {item.line}")
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
