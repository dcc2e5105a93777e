"""The request schema of ``GET /openapi.json`` against the parser, field by field, in both directions.

Both come from one table (`spinf.protocol.schema`), but the top-level keys, the pack references and the bounds
that a later step enforces with its own code are the parser's own code, so they are held to each other here:

- every field the document declares is present in one of a few valid bodies (`BASES`) and is set, in turn, to
  every JSON type and to each of its bounds and one past it, or removed. A body the document refuses must be
  refused by the parser (with whatever code); a body it accepts must not be refused as a schema error of that
  field (``invalid_field`` at or below it);
- every key the parser reads is a key the document declares where the parser reads it.

So a field added to the table, the parser or the document alone fails a test.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from spinf.errors import ApiError
from spinf.protocol.request import parse_score_request
from spinf.settings import Limits
from tests.protocol.bodies import refusal
from tests.protocol.document import CHAT_REQUEST, COMPONENTS, SCORE_REQUEST, deref, describing

PARSE = {"served_names": ["spinf-12b"], "trusted": True}  # trusted: limits and features are checked, as documented
SCORED = {
    "id": "s",
    "template": "Is {who} {what}? Answer:{?}",
    "options": [" yes", " no"],
    "combinations": [{"who": "it", "what": "ok"}],
    "values": {"who": ["x"]},  # ignored without "all"
    "empty_floor": True,
    "group": "g",
}
GRID = {
    "id": "g",
    "template": "{a}:{?}",
    "options": [" yes"],
    "combinations": "all",
    "values": {"a": ["x", "y"]},
    "empty_floor": None,
    "group": None,
}
SEARCHED = {"id": "x", "template": 'It says "{*}"', "max_tokens": 16, "top_k": 5, "calibration": {"a": 1, "b": 0}}
GENERATED = {
    "id": "gen",
    "template": "Reply: {*}",
    "max_tokens": 80,
    "generate": {"temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 1, "n": 2},
}
MESSAGES = [{"role": "user", "content": "Hello."}, {"content": [{"type": "text", "text": "Hi"}]}]
INPUT = {
    "id": "a",
    "messages": MESSAGES,
    "query_ids": ["s", "g", "x", "gen"],
    "queries": [{"id": "own", "template": "Own?{?}", "options": [" yes"]}],
    "parameters": {"p": "v", "n": 1, "f": 0.5, "b": True},
}
RICH = {
    "model": "spinf-12b",
    "endpoint": "triage",
    "limits": Limits().as_dict(),
    "features": {"media": ["image"], "extraction": True, "generation": True},
    "scoring": {"empty_floor": True, "case_insensitive": True, "queries": [SCORED, GRID, SEARCHED, GENERATED]},
    "inputs": [INPUT, {"id": "b", "messages": [], "query_ids": None}],
}
IMAGE = {"url": "data:image/png;base64,AA==", "detail": "low"}
MEDIA = [
    {"type": "image_url", "image_url": IMAGE},
    {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}},
    {"type": "video", "video": {"frames": [{"t": 0, "image_url": IMAGE}], "detail": "low"}},
]
PACK = {
    "id": "acme/tone",
    "version": "1.0.0",
    "context": "chat",
    "decision": {"mode": "max", "threshold": 0.5, "thresholds": {"rude": 0.5}, "critical": ["rude"]},
    "include_queries": True,
}
BASES = {
    "rich": RICH,
    "messages-form": {"messages": MESSAGES, "scoring": {"queries": [SCORED]}, "inputs": None},
    # The parser is told of no model media and no pack catalog here: these are refused, whatever their fields say.
    "media": {"inputs": [{"id": "m", "messages": [{"content": MEDIA}]}], "scoring": {"queries": [SCORED]}},
    "packs": {"inputs": [{"id": "p", "messages": []}], "scoring": {"queries": [], "packs": [PACK]}},
}
GENERIC = [None, True, False, 0, 1, -1, 0.5, 2**31, "", "x", "all", [], ["x"], [1], {}, {"x": "y"}, {"x": 1}]
REMOVED = object()


def test_the_bases_are_valid_for_the_document_and_the_parser():
    for name, body in BASES.items():
        assert SCORE_REQUEST.is_valid(body), name
    assert refusal(RICH, **PARSE) is None and refusal(BASES["messages-form"], **PARSE) is None


def nodes(value: object, schema: dict, where: str, path: tuple = ()) -> Iterator[tuple[tuple, dict, str, object]]:
    """Every object and list inside ``value``, with its path, the schema describing it and that schema's name."""
    schema, where = describing(schema, where, value)
    if isinstance(value, dict | list):
        yield path, schema, where, value
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        sub, sub_where = inside(schema, where, key)
        yield from nodes(child, sub, sub_where, (*path, key))


def inside(schema: dict, where: str, key: str | int) -> tuple[dict, str]:
    """The schema of a property, map value (``*``) or list item (``[]``) of the object or list that ``schema``
    describes."""
    if isinstance(key, int):
        return schema.get("items", {}), f"{where}/[]"
    if key in schema.get("properties", {}):
        return schema["properties"][key], f"{where}/{key}"
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else {}, f"{where}/*"


def declared(schema: dict, where: str) -> set[tuple[str, str]]:
    """Every (schema name, property) the document declares from ``schema`` down; ``*`` for a map's values and
    ``[]`` for a list's items."""
    schema, where = deref(schema, where)
    union = schema.get("anyOf", schema.get("oneOf", [])) if "type" not in schema else []
    found = set().union(*(declared(branch, f"{where}|{k}") for k, branch in enumerate(union)))
    for key, sub in schema.get("properties", {}).items():
        found |= {(where, key)} | declared(sub, f"{where}/{key}")
    if isinstance(schema.get("additionalProperties"), dict):
        found |= {(where, "*")} | declared(schema["additionalProperties"], f"{where}/*")
    if "items" in schema:
        found |= {(where, "[]")} | declared(schema["items"], f"{where}/[]")
    return found


def test_every_declared_field_is_present_in_a_base():
    present = set()
    for body in BASES.values():
        for _, schema, where, value in nodes(body, COMPONENTS["ScoreRequest"], "ScoreRequest"):
            if isinstance(value, dict):
                present |= {(where, key if key in schema.get("properties", {}) else "*") for key in value}
            elif value:
                present.add((where, "[]"))
    assert declared(COMPONENTS["ScoreRequest"], "ScoreRequest") - present == set()


def edges(schema: dict) -> list:
    """Values at each bound of ``schema`` and one past it, its enum and const values and one more."""
    schema, _ = deref(schema, "")
    found = [edge for branch in schema.get("anyOf", schema.get("oneOf", [])) for edge in edges(branch)]
    if "minimum" in schema:
        found += [schema["minimum"] - 1, schema["minimum"], float(schema["minimum"])]  # a float: not an integer
    if "maximum" in schema:
        found += [schema["maximum"], schema["maximum"] + 1]
    if "exclusiveMinimum" in schema:
        found += [schema["exclusiveMinimum"], schema["exclusiveMinimum"] + 1e-9]
    for key, more in (("minLength", -1), ("minLength", 0), ("maxLength", 0), ("maxLength", 1)):
        if key in schema and schema[key] + more >= 0:
            found.append("x" * (schema[key] + more))
    if "enum" in schema:
        found += [*schema["enum"], "bogus"]
    if "const" in schema:
        found.append(schema["const"])
    return found


def mutations(body: dict) -> Iterator[tuple[dict, tuple, object, bool]]:
    """Each one-field change of ``body``: (changed body, the field's path, its new value or `REMOVED`, whether the
    field was in ``body``)."""
    for path, schema, where, value in nodes(body, COMPONENTS["ScoreRequest"], "ScoreRequest"):
        if isinstance(value, list):
            keys = [0] if value else []
        else:
            keys = list(dict.fromkeys([*schema.get("properties", {}), *value]))
        for key in keys:
            sub, _ = inside(schema, where, key)
            for probe in [*GENERIC, *edges(sub)] + [REMOVED] * (isinstance(key, str) and key in value):
                present = isinstance(value, list) or key in value
                yield changed(body, (*path, key), probe), (*path, key), probe, present


def changed(body: dict, path: tuple, probe: object) -> dict:
    out = copy.deepcopy(body)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if probe is REMOVED:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(probe)
    return out


def param_of(body: dict, path: tuple) -> str:
    """The param path under which the parser reports the field at ``path`` (the messages form reads inputs.0)."""
    dotted = ".".join(map(str, path))
    return f"inputs.0.{dotted}" if body.get("messages") is not None and path[0] == "messages" else dotted


def disagreement(body: dict, path: tuple, present: bool) -> str | None:
    error = refusal(body, **PARSE)
    if not SCORE_REQUEST.is_valid(body):
        return None if error is not None else "the document refuses it, the parser accepts it"
    param = param_of(body, path)
    if present and error is not None and error.code == "invalid_field":
        if error.param == param or error.param.startswith(param + "."):
            return f"the document accepts it, the parser refuses it: {error!r}"
    return None


@pytest.mark.parametrize("base", list(BASES))
def test_the_parser_and_the_document_agree_on_every_field(base):
    found = []
    for body, path, probe, present in mutations(BASES[base]):
        problem = disagreement(body, path, present)
        if problem:
            value = "removed" if probe is REMOVED else f"= {probe!r:.60}"
            found.append(f"{'.'.join(map(str, path))} {value}: {problem}")
    assert found == [], "\n".join(found[:10])


def test_the_chat_route_needs_scoring_in_both():
    for body in ({"inputs": RICH["inputs"]}, {**RICH, "scoring": None}):
        assert not CHAT_REQUEST.is_valid(body)
        assert refusal(body, chat=True, **PARSE).code in ("scoring_required", "invalid_field")
    assert CHAT_REQUEST.is_valid(RICH) and refusal(RICH, chat=True, **PARSE) is None


class Recorder(dict):
    """A JSON object that notes each key read from it: (where it is, the key, whether the document declares it)."""

    def __init__(self, value: dict, where: str, declared: set[str], read: set):
        super().__init__(value)
        self.where, self.declared, self.read = where, declared, read

    def _note(self, key) -> None:
        self.read.add((self.where, key, key in self.declared))

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


def recording(value: object, schema: dict, where: str, read: set) -> object:
    """``value`` with each object the document gives properties to (not the maps) made a `Recorder`."""
    schema, where = describing(schema, where, value)
    if isinstance(value, list):
        return [recording(item, *inside(schema, where, j), read) for j, item in enumerate(value)]
    if not isinstance(value, dict):
        return value
    children = {key: recording(child, *inside(schema, where, key), read) for key, child in value.items()}
    return Recorder(children, where, set(schema["properties"]), read) if "properties" in schema else children


@pytest.mark.parametrize("base", list(BASES))
def test_every_key_the_parser_reads_is_declared_where_it_reads_it(base):
    read: set[tuple[str, str, bool]] = set()
    try:
        parse_score_request(recording(BASES[base], COMPONENTS["ScoreRequest"], "ScoreRequest", read), **PARSE)
    except ApiError as e:
        assert base in ("media", "packs"), e  # refused after the reads that matter here: media gates, unknown_pack
    assert read and {(where, key) for where, key, ok in read if not ok} == set()


def test_a_null_messages_beside_inputs_is_the_inputs_form_in_both():
    """Regression: the document refused ``messages: null`` beside ``inputs``, which §4.1 counts as absent."""
    body = {**RICH, "messages": None}
    assert SCORE_REQUEST.is_valid(body) and refusal(body, **PARSE) is None
    both = {**RICH, "messages": MESSAGES}
    assert not SCORE_REQUEST.is_valid(both) and refusal(both, **PARSE).param == "messages"


def test_values_beside_a_combination_list_are_unbounded_in_both():
    """Regression: the document bounded ``values`` always; they are used, and bounded, only with "all" (§4.7)."""
    query = {**SCORED, "values": {"who": [], "what": ["x" * 300]}}
    body = {**RICH, "scoring": {**RICH["scoring"], "queries": [query, GRID, SEARCHED, GENERATED]}}
    assert SCORE_REQUEST.is_valid(body) and refusal(body, **PARSE) is None
    grid = {**GRID, "values": {"a": []}}
    body = {**RICH, "scoring": {**RICH["scoring"], "queries": [SCORED, grid, SEARCHED, GENERATED]}}
    assert refusal(body, **PARSE).code == "missing_value"
