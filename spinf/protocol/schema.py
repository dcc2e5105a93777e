"""The JSON schema of a score request (api spec §4.1–§4.5; step 11 of §4.12), as small composable checks.

Each check takes ``(value, param path)`` and raises 400 ``invalid_field`` at the first problem, so the param is the
dotted location of the first schema error; an object's fields are checked in the order of the spec's tables. The
types are strict JSON: a bool is not a number, an integer field takes no float, numbers are finite. Unknown keys are
ignored. ``null`` is accepted only where the spec gives it a meaning (``query_ids``, ``combinations``, ``values``,
a query's ``empty_floor`` and ``group``, ``generate``); anywhere else it is a wrong type. The schema checks shape
only: which fields go with which slot, and everything that needs the template, is `spinf.protocol.request`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from spinf.errors import ApiError, bad_request

MAX_ID_CHARS = 128
MAX_SEED = 2**31 - 1

Check = Callable[[object, str], None]


def invalid_field(param: str, message: str) -> ApiError:
    """A 400 ``invalid_field`` at ``param``: the error of every schema check."""
    return bad_request("invalid_field", param, message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _boolean(value: object, path: str) -> None:
    if not isinstance(value, bool):
        raise invalid_field(path, f"{path} must be true or false")


def _string(max_chars: int | None = None) -> Check:
    def check(value: object, path: str) -> None:
        if not isinstance(value, str):
            raise invalid_field(path, f"{path} must be a string")
        if max_chars is not None and len(value) > max_chars:
            raise invalid_field(path, f"{path} has {len(value)} characters; at most {max_chars}")

    return check


def _integer(lo: int, hi: int) -> Check:
    def check(value: object, path: str) -> None:
        if not _is_int(value) or not lo <= value <= hi:
            raise invalid_field(path, f"{path} must be an integer from {lo} to {hi}")

    return check


def _number(lo: float = -math.inf, hi: float = math.inf, *, above_lo: bool = False) -> Check:
    def check(value: object, path: str) -> None:
        if not _is_number(value) or not lo <= value <= hi or (above_lo and value == lo):
            low = f"above {lo}" if above_lo else f"at least {lo}"
            bounds = "" if math.isinf(hi) else f", {low} and at most {hi}"
            raise invalid_field(path, f"{path} must be a number{bounds}")

    return check


def _scalar(value: object, path: str) -> None:
    if not (isinstance(value, str | bool) or _is_number(value)):
        raise invalid_field(path, f"{path} must be a string, a number or a boolean")


def _nullable(check: Check) -> Check:
    def nullable(value: object, path: str) -> None:
        if value is not None:
            check(value, path)

    return nullable


def _list_of(item: Check) -> Check:
    def check(value: object, path: str) -> None:
        if not isinstance(value, list):
            raise invalid_field(path, f"{path} must be a list")
        for j, element in enumerate(value):
            item(element, f"{path}.{j}")

    return check


def _map_of(item: Check) -> Check:
    def check(value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise invalid_field(path, f"{path} must be an object")
        for key, element in value.items():
            item(element, f"{path}.{key}")

    return check


def _object(*fields: tuple[str, bool, Check]) -> Check:
    """An object with the given (key, required, check) fields, checked in that order; other keys are ignored."""

    def check(value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise invalid_field(path, f"{path} must be an object")
        for key, required, field in fields:
            if key in value:
                field(value[key], f"{path}.{key}")
            elif required:
                raise invalid_field(f"{path}.{key}", f"{path}.{key} is required")

    return check


_COMBINATION_LIST = _list_of(_map_of(_string()))
_GENERATE = _object(
    ("temperature", False, _number(0, 2)),
    ("top_p", False, _number(0, 1, above_lo=True)),
    ("top_k", False, _integer(1, 100)),
    ("seed", False, _integer(0, MAX_SEED)),
    ("n", False, _integer(1, 6)),
)


def _combinations(value: object, path: str) -> None:
    if value is None or value == "all":
        return
    if not isinstance(value, list):
        raise invalid_field(path, f'{path} must be a list of value maps, "all" or null')
    _COMBINATION_LIST(value, path)


def _generate(value: object, path: str) -> None:
    if value is None or isinstance(value, bool):
        return
    if not isinstance(value, dict):
        raise invalid_field(path, f"{path} must be true, false, null or an object")
    _GENERATE(value, path)


_QUERY = _object(
    ("id", True, _string(MAX_ID_CHARS)),
    ("template", True, _string()),
    ("options", False, _list_of(_string())),
    ("combinations", False, _combinations),
    ("values", False, _nullable(_map_of(_list_of(_string())))),
    ("empty_floor", False, _nullable(_boolean)),
    ("group", False, _nullable(_string(MAX_ID_CHARS))),
    ("max_tokens", False, _integer(1, 100)),
    ("top_k", False, _integer(1, 20)),
    ("calibration", False, _object(("a", False, _number()), ("b", False, _number()))),
    ("generate", False, _generate),
)
_PART = _object(("type", True, _string()))
_TEXT = _nullable(_string())


def _content(value: object, path: str) -> None:
    """A string, or a list of parts; a part's payload is checked here only for text (media payloads: §4.3)."""
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise invalid_field(path, f"{path} must be a string or a list of content parts")
    for k, part in enumerate(value):
        _PART(part, f"{path}.{k}")
        if part["type"] == "text":
            _TEXT(part.get("text"), f"{path}.{k}.text")


_MESSAGE = _object(("role", False, _string()), ("content", True, _content))
_INPUT = _object(
    ("id", True, _string(MAX_ID_CHARS)),
    ("messages", True, _list_of(_MESSAGE)),
    ("query_ids", False, _nullable(_list_of(_string()))),
    ("queries", False, _list_of(_QUERY)),
    ("parameters", False, _map_of(_scalar)),
)
_SCORING = _object(
    ("empty_floor", False, _boolean),
    ("case_insensitive", False, _boolean),
    ("queries", False, _list_of(_QUERY)),
)


def check_scoring(scoring: dict) -> None:
    """The schema of the ``scoring`` object (packs excepted: step 10 checked them)."""
    _SCORING(scoring, "scoring")


def check_input(raw: object, path: str) -> None:
    """The schema of one input object at ``path`` (``inputs.<i>``)."""
    _INPUT(raw, path)
