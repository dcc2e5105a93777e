"""The body of ``POST /v1/decisions`` as the ``openai`` SDK sends it, checked and parsed into frozen objects.

The shape is the SDK's (``openai/types/decision_create_params.py``): ``model``, ``input`` (a string, or messages
and tool items), ``questions`` (predicate, choice or score) and three keys this server accepts and ignores
(``prompt_cache_key``, ``prompt_cache_options``, ``safety_identifier``). The limits are the SDK's: 1-400 questions,
2-255 choices, each choice unique (typed: the string ``"true"`` and the boolean ``true`` differ), and an
``input_json`` part of at most 32 container levels, 10,000 values and 256 KiB of compact UTF-8 JSON; score levels
are held to 2-255 as choices are. Each problem is a 400 in the error envelope (api spec §2.5) with the param path of
the SDK's body (``questions.3.choices.1.value``); the first problem found is reported. Unknown keys are ignored, as
in a score body (api spec §4.1). What the input says is rendered by `spinf.decisions.render`; this module only
reads it.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from spinf.errors import bad_request

MAX_QUESTIONS = 400
MIN_CHOICES, MAX_CHOICES = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 255
JSON_MAX_DEPTH, JSON_MAX_VALUES, JSON_MAX_BYTES = 32, 10_000, 256 * 1024
KINDS = ("predicate", "choice", "score")
ROLES = ("user", "developer", "system", "assistant")
TOOL_ITEMS = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}
# content part types by role (the SDK's unions); an input_image is read in the input (a message, a tool output), not
# in a question's instructions (they become a prompt template, which is text)
PARTS = {
    "user": ("input_text", "input_image", "input_json"),
    "developer": ("input_text",),
    "system": ("input_text",),
    "assistant": ("output_text", "refusal"),
    "tool_output": ("input_text", "input_image"),
    "instructions": ("input_text", "input_image", "input_json"),
}


@attrs.frozen
class Part:
    """A content part: ``kind`` is its type (``text``, ``json``, ``image``); ``text`` its text (the refusal's, for a
    refusal), ``data`` (JSON), or an image's data URL ``url`` and ``detail``, with its SDK path ``at``."""

    kind: str
    text: str = ""
    data: Any = None
    url: str = ""
    detail: str = "auto"
    at: str = ""


@attrs.frozen
class Item:
    """One input item: a message (``role``, ``parts``) or a tool item (``kind`` the SDK's type, ``name`` the call's
    name, with the matching call's for an output; ``text`` the arguments or input; ``parts`` an output's)."""

    kind: str  # "message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output"
    parts: tuple[Part, ...] = ()
    role: str = ""
    name: str = ""
    text: str = ""


@attrs.frozen
class Value:
    """A choice's value (a string or a boolean: typed) or a score level's label (a string), with its description."""

    value: str | bool
    description: str | None = None


@attrs.frozen
class Question:
    kind: str  # "predicate", "choice", "score"
    name: str | None
    instructions: tuple[Part, ...]
    values: tuple[Value, ...] = ()  # the choices, or the levels lowest first; () for a predicate


@attrs.frozen
class DecisionRequest:
    model: str
    input: str | tuple[Item, ...]
    questions: tuple[Question, ...]


def parse_decision_request(body: object) -> DecisionRequest:
    """The checked request of a decisions body, or `spinf.errors.ApiError` (400) at the first problem."""
    if not isinstance(body, dict):
        raise _invalid("body", "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", "model must be a non-empty string (a name of the served model)")
    for key in ("prompt_cache_key", "safety_identifier"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise _invalid(key, f"{key} must be a string or null")
    if body.get("prompt_cache_options") is not None and not isinstance(body["prompt_cache_options"], dict):
        raise _invalid("prompt_cache_options", "prompt_cache_options must be an object or null")
    content = _input(body.get("input"))
    questions = body.get("questions")
    if not isinstance(questions, list) or not 1 <= len(questions) <= MAX_QUESTIONS:
        raise _invalid("questions", f"questions must be a list of 1 to {MAX_QUESTIONS} questions")
    return DecisionRequest(model, content, tuple(_question(q, f"questions.{k}") for k, q in enumerate(questions)))


def _invalid(param: str, message: str):
    return bad_request("invalid_field", param, message)


def _text(value: object, param: str, what: str) -> str:
    if not isinstance(value, str):
        raise _invalid(param, f"{what} must be a string")
    return value


# the input


def _input(value: object) -> str | tuple[Item, ...]:
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise _invalid("input", "input must be a string or a non-empty list of messages and tool items")
    items: list[Item] = []
    calls: dict[tuple[str, str], str] = {}  # (call type, call_id) -> the call's name
    for m, item in enumerate(value):
        items.append(_item(item, f"input.{m}", calls))
    return tuple(items)


def _item(item: object, at: str, calls: dict[tuple[str, str], str]) -> Item:
    if not isinstance(item, dict):
        raise _invalid(at, "an input item must be an object")
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        raise _invalid(f"{at}.type", "type must be a string")
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise _invalid(f"{at}.role", f"role must be one of {', '.join(ROLES)}")
        return Item("message", _parts(item.get("content"), f"{at}.content", role), role=role)
    if kind in ("function_call", "custom_tool_call"):
        call_id = _text(item.get("call_id"), f"{at}.call_id", "call_id")
        name = _text(item.get("name"), f"{at}.name", "name")
        namespace = item.get("namespace")
        if namespace is not None:
            name = f"{_text(namespace, f'{at}.namespace', 'namespace')}.{name}"
        key = "arguments" if kind == "function_call" else "input"
        text = _text(item.get(key), f"{at}.{key}", key)
        calls[(kind, call_id)] = name
        return Item(kind, name=name, text=text)
    if kind in TOOL_ITEMS:
        call_id = _text(item.get("call_id"), f"{at}.call_id", "call_id")
        name = calls.get((TOOL_ITEMS[kind], call_id))
        if name is None:
            raise _invalid(f"{at}.call_id", f"no earlier {TOOL_ITEMS[kind]} item has call_id {call_id!r}")
        return Item(kind, _parts(item.get("output"), f"{at}.output", "tool_output"), name=name)
    raise _invalid(f"{at}.type", "type must be message, function_call, function_call_output, custom_tool_call or "
                   "custom_tool_call_output")  # fmt: skip


def _parts(value: object, at: str, owner: str) -> tuple[Part, ...]:
    """A string or a list of parts, of the types ``owner`` may hold (`PARTS`)."""
    if isinstance(value, str):
        return (Part("text", value),)
    if not isinstance(value, list):
        raise _invalid(at, "content must be a string or a list of parts")
    return tuple(_part(part, f"{at}.{k}", owner) for k, part in enumerate(value))


def _part(part: object, at: str, owner: str) -> Part:
    kind = part.get("type") if isinstance(part, dict) else None
    allowed = PARTS[owner]
    if kind not in allowed:
        raise bad_request("unsupported_content", at, f"a part here must have a type among {', '.join(allowed)}")
    if kind == "input_image":
        return _image(part, at, owner)
    if kind == "input_json":
        return Part("json", data=_json_data(part.get("data"), f"{at}.data"))
    key = "refusal" if kind == "refusal" else "text"
    return Part("text", _text(part.get(key), f"{at}.{key}", key))


def _image(part: dict, at: str, owner: str) -> Part:
    """An ``input_image``: its ``image_url`` (a data URL, checked later as a score body's) and its ``detail``."""
    if owner == "instructions":
        raise bad_request(
            "media_not_supported",
            at,
            "a question's instructions become its prompt template, which holds text only: put the image in the input",
        )
    url = part.get("image_url")
    if url is None and part.get("file_id") is not None:
        raise bad_request(
            "media_not_supported", f"{at}.file_id", "file ids are not read: send the image as a data URL in image_url"
        )
    url = _text(url, f"{at}.image_url", "image_url")
    detail = part.get("detail")
    detail = "auto" if detail is None else _text(detail, f"{at}.detail", "detail")
    return Part("image", url=url, detail=detail, at=at)


def _json_data(data: object, at: str) -> object:
    objects = isinstance(data, dict) or (isinstance(data, list) and all(isinstance(v, dict) for v in data))
    if not objects:
        raise _invalid(at, "data must be a JSON object or an array of objects")
    values, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        values += 1
        if isinstance(value, dict | list):
            if depth > JSON_MAX_DEPTH:
                raise _invalid(at, f"data is nested deeper than {JSON_MAX_DEPTH} container levels")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
        if values > JSON_MAX_VALUES:
            raise _invalid(at, f"data holds more than {JSON_MAX_VALUES:,} values")
    if len(compact_json(data).encode()) > JSON_MAX_BYTES:
        raise _invalid(at, f"data is over {JSON_MAX_BYTES // 1024} KiB as compact UTF-8 JSON")
    return data


def compact_json(data: object) -> str:
    """JSON text without spaces, non-ASCII kept: how a JSON part and a choice's value are written in prompts."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


# questions


def _question(q: object, at: str) -> Question:
    if not isinstance(q, dict):
        raise _invalid(at, "a question must be an object")
    kind = q.get("type")
    if kind not in KINDS:
        raise _invalid(f"{at}.type", "type must be predicate, choice or score")
    name = q.get("name")
    if name is not None and not isinstance(name, str):
        raise _invalid(f"{at}.name", "name must be a string")
    instructions = q.get("instructions")
    if isinstance(instructions, str) and not instructions.strip() or instructions == []:
        raise _invalid(f"{at}.instructions", "instructions must not be empty")
    parts = _parts(instructions, f"{at}.instructions", "instructions")
    if kind == "predicate":
        return Question(kind, name, parts)
    if kind == "choice":
        values = _values(q.get("choices"), f"{at}.choices", "choices", "value", (MIN_CHOICES, MAX_CHOICES))
    else:
        values = _values(q.get("levels"), f"{at}.levels", "levels", "label", (MIN_LEVELS, MAX_LEVELS))
    return Question(kind, name, parts, values)


def _values(entries: object, at: str, what: str, key: str, bounds: tuple[int, int]) -> tuple[Value, ...]:
    lo, hi = bounds
    if not isinstance(entries, list):
        raise _invalid(at, f"{what} must be a list of {lo} to {hi} objects")
    if not lo <= len(entries) <= hi:
        raise bad_request("too_many_options", at, f"{what} must hold {lo} to {hi} entries, not {len(entries)}")
    values: list[Value] = []
    seen: set[tuple[type, str | bool]] = set()
    for j, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise _invalid(f"{at}.{j}", f"each of {what} must be an object")
        value = entry.get(key)
        typed = isinstance(value, str) or (key == "value" and isinstance(value, bool))
        if not typed:
            kinds = "a string or a boolean" if key == "value" else "a string"
            raise _invalid(f"{at}.{j}.{key}", f"{key} must be {kinds}")
        description = entry.get("description")
        if description is not None and not isinstance(description, str):
            raise _invalid(f"{at}.{j}.description", "description must be a string")
        if (type(value), value) in seen:
            raise bad_request("duplicate_option", f"{at}.{j}", f"{what} must be unique: {compact_json(value)} repeats")
        seen.add((type(value), value))
        values.append(Value(value, description))
    return tuple(values)
