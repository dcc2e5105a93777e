"""Shapes: the building blocks of the request's one schema table (`spinf.protocol.schema`).

A shape is the schema of a JSON value, declared once and read twice. `Shape.check` is the validator: it raises 400
``invalid_field`` at the first problem, with the dotted location of that problem as param (an object's fields in
declaration order, list items by index). `Shape.json_schema` writes the same constraints as JSON Schema 2020-12
for the OpenAPI document. The types are strict JSON: a bool is not a number, an integer takes no float, numbers are
finite and within the float range (the document's bounds of every number). JSON Schema cannot tell ``16.0`` from
``16``: that the check refuses the float is the one thing the document cannot say.

Two keyword maps go into the document unchecked: ``doc`` only annotates (description, default), and ``elsewhere``
states a constraint that another step enforces with its own code or in its own order (an empty option list is
``too_many_options``, §4.8; an unknown top-level key is the parser's business). A `Named` shape is written once
under ``components/schemas`` and referenced wherever it is used.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Mapping

import attrs

from spinf.errors import ApiError, bad_request

SCHEMAS = "#/components/schemas/"
FLOAT_MAX = sys.float_info.max


def invalid_field(param: str, message: str) -> ApiError:
    """A 400 ``invalid_field`` at ``param``: the error of every schema check."""
    return bad_request("invalid_field", param, message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A JSON number the server computes with: a finite float, or an integer within the float range (a larger one
    has no float, so `math.isfinite` and `float` raise on it)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= FLOAT_MAX


def _bounds(schema: dict, **keywords: object) -> dict:
    return {**schema, **{key: value for key, value in keywords.items() if value is not None}}


@attrs.frozen(kw_only=True)
class Shape:
    """The common part of every shape: the document's extra keywords (see the module docstring)."""

    doc: Mapping[str, object] = attrs.field(factory=dict)
    elsewhere: Mapping[str, object] = attrs.field(factory=dict)

    def check(self, value: object, path: str) -> None:
        """Raise 400 ``invalid_field`` at the first problem of ``value``, which sits at ``path``."""
        raise NotImplementedError

    def admits(self, value: object) -> bool:
        """Whether ``value`` has this shape's JSON type (a `Union` picks its branch by it)."""
        raise NotImplementedError

    def keywords(self) -> dict:
        """The JSON Schema of what `check` enforces."""
        raise NotImplementedError

    def parts(self) -> Iterator[Shape]:
        """The shapes directly inside this one."""
        return iter(())

    def json_schema(self) -> dict:
        return {**self.keywords(), **self.elsewhere, **self.doc}


@attrs.frozen
class Boolean(Shape):
    def check(self, value: object, path: str) -> None:
        if not isinstance(value, bool):
            raise invalid_field(path, f"{path} must be true or false")

    def admits(self, value: object) -> bool:
        return isinstance(value, bool)

    def keywords(self) -> dict:
        return {"type": "boolean"}


@attrs.frozen
class String(Shape):
    min_chars: int | None = None
    max_chars: int | None = None

    def check(self, value: object, path: str) -> None:
        if not isinstance(value, str):
            raise invalid_field(path, f"{path} must be a string")
        if self.max_chars is not None and len(value) > self.max_chars:
            raise invalid_field(path, f"{path} has {len(value)} characters; at most {self.max_chars}")
        if self.min_chars is not None and len(value) < self.min_chars:
            raise invalid_field(path, f"{path} has {len(value)} characters; at least {self.min_chars}")

    def admits(self, value: object) -> bool:
        return isinstance(value, str)

    def keywords(self) -> dict:
        return _bounds({"type": "string"}, minLength=self.min_chars, maxLength=self.max_chars)


@attrs.frozen
class Integer(Shape):
    lo: int
    hi: int | None = None

    def check(self, value: object, path: str) -> None:
        if not _is_int(value) or value < self.lo or (self.hi is not None and value > self.hi):
            bounds = f"of at least {self.lo}" if self.hi is None else f"from {self.lo} to {self.hi}"
            raise invalid_field(path, f"{path} must be an integer {bounds}")

    def admits(self, value: object) -> bool:
        return _is_int(value)

    def keywords(self) -> dict:
        return _bounds({"type": "integer"}, minimum=self.lo, maximum=self.hi)


@attrs.frozen
class Number(Shape):
    """A finite number; ``above_lo`` makes the lower bound exclusive."""

    lo: float | None = None
    hi: float | None = None
    above_lo: bool = False

    def check(self, value: object, path: str) -> None:
        if not is_number(value) or not self._within(value):
            bounds = [] if self.lo is None else [f"above {self.lo}" if self.above_lo else f"at least {self.lo}"]
            bounds += [] if self.hi is None else [f"at most {self.hi}"]
            raise invalid_field(path, f"{path} must be a number" + (f", {' and '.join(bounds)}" if bounds else ""))

    def _within(self, value: float) -> bool:
        low = self.lo is None or value > self.lo or (value == self.lo and not self.above_lo)
        return low and (self.hi is None or value <= self.hi)

    def admits(self, value: object) -> bool:
        return is_number(value)

    def keywords(self) -> dict:
        lo = {"exclusiveMinimum" if self.above_lo else "minimum": -FLOAT_MAX if self.lo is None else self.lo}
        return _bounds({"type": "number"}, **lo, maximum=FLOAT_MAX if self.hi is None else self.hi)


@attrs.frozen
class Const(Shape):
    value: str

    def check(self, value: object, path: str) -> None:
        if not self.admits(value):
            raise invalid_field(path, f"{path} must be {json.dumps(self.value)}")

    def admits(self, value: object) -> bool:
        return value == self.value and type(value) is type(self.value)

    def keywords(self) -> dict:
        return {"const": self.value}


@attrs.frozen
class Enum(Shape):
    values: tuple[str, ...]

    def check(self, value: object, path: str) -> None:
        if not self.admits(value):
            raise invalid_field(path, f"{path} must be one of {', '.join(map(json.dumps, self.values))}")

    def admits(self, value: object) -> bool:
        return isinstance(value, str) and value in self.values

    def keywords(self) -> dict:
        return {"enum": list(self.values)}


@attrs.frozen
class Nullable(Shape):
    """``null``, or a value of ``shape``."""

    shape: Shape

    def check(self, value: object, path: str) -> None:
        if value is not None:
            self.shape.check(value, path)

    def admits(self, value: object) -> bool:
        return value is None or self.shape.admits(value)

    def keywords(self) -> dict:
        inner = self.shape.json_schema()
        branches = inner["anyOf"] if list(inner) == ["anyOf"] else [inner]  # a union's branches, and null
        return {"anyOf": [*branches, {"type": "null"}]}

    def parts(self) -> Iterator[Shape]:
        yield self.shape


@attrs.frozen
class ListOf(Shape):
    item: Shape
    min_items: int | None = None

    def check(self, value: object, path: str) -> None:
        if not isinstance(value, list):
            raise invalid_field(path, f"{path} must be a list")
        if self.min_items is not None and len(value) < self.min_items:
            raise invalid_field(path, f"{path} has {len(value)} items; at least {self.min_items}")
        for j, element in enumerate(value):
            self.item.check(element, f"{path}.{j}")

    def admits(self, value: object) -> bool:
        return isinstance(value, list)

    def keywords(self) -> dict:
        return _bounds({"type": "array", "items": self.item.json_schema()}, minItems=self.min_items)

    def parts(self) -> Iterator[Shape]:
        yield self.item


@attrs.frozen
class MapOf(Shape):
    """An object with any keys, each value a ``value``."""

    value: Shape

    def check(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise invalid_field(path, f"{path} must be an object")
        for key, element in value.items():
            self.value.check(element, f"{path}.{key}")

    def admits(self, value: object) -> bool:
        return isinstance(value, dict)

    def keywords(self) -> dict:
        return {"type": "object", "additionalProperties": self.value.json_schema()}

    def parts(self) -> Iterator[Shape]:
        yield self.value


@attrs.frozen
class Field:
    """A key of an `Object`. ``checked=False``: the document lists it, but an earlier step checks it in its own
    order, so the object's check skips it."""

    key: str
    shape: Shape
    required: bool = False
    checked: bool = True


@attrs.frozen
class Object(Shape):
    """An object with the given fields, checked in their order; other keys are refused when ``closed``."""

    fields: tuple[Field, ...]
    closed: bool = False

    def keys(self) -> tuple[str, ...]:
        return tuple(field.key for field in self.fields)

    def check(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise invalid_field(path, f"{path} must be an object")
        if self.closed:
            for key in value:
                if key not in self.keys():
                    raise invalid_field(
                        f"{path}.{key}", f"{key!r} is not a key here; they are {', '.join(self.keys())}"
                    )
        for field in self.fields:
            if not field.checked:
                continue
            if field.key in value:
                field.shape.check(value[field.key], f"{path}.{field.key}")
            elif field.required:
                raise invalid_field(f"{path}.{field.key}", f"{path}.{field.key} is required")

    def admits(self, value: object) -> bool:
        return isinstance(value, dict)

    def keywords(self) -> dict:
        schema = {"type": "object", "properties": {field.key: field.shape.json_schema() for field in self.fields}}
        required = [field.key for field in self.fields if field.required]
        if required:
            schema["required"] = required
        if self.closed:
            schema["additionalProperties"] = False
        return schema

    def parts(self) -> Iterator[Shape]:
        return (field.shape for field in self.fields)


@attrs.frozen
class Union(Shape):
    """A value of one of the ``branches``, chosen by JSON type: the first branch that admits it checks it.

    ``expected`` says what the union takes, for the message when no branch admits the value.
    """

    branches: tuple[Shape, ...]
    expected: str

    def check(self, value: object, path: str) -> None:
        for branch in self.branches:
            if branch.admits(value):
                branch.check(value, path)
                return
        raise invalid_field(path, f"{path} must be {self.expected}")

    def admits(self, value: object) -> bool:
        return any(branch.admits(value) for branch in self.branches)

    def keywords(self) -> dict:
        return {"anyOf": [branch.json_schema() for branch in self.branches]}

    def parts(self) -> Iterator[Shape]:
        return iter(self.branches)


@attrs.frozen
class Named(Shape):
    """``shape`` under a component name: the document writes it once under that name (`named_shapes` finds them)
    and refers to it by ``$ref`` wherever it is used."""

    name: str
    shape: Shape

    def check(self, value: object, path: str) -> None:
        self.shape.check(value, path)

    def admits(self, value: object) -> bool:
        return self.shape.admits(value)

    def keywords(self) -> dict:
        return {"$ref": SCHEMAS + self.name}

    def parts(self) -> Iterator[Shape]:
        yield self.shape


@attrs.frozen
class Parts(Shape):
    """A content part: an object whose string ``type`` names its payload key (api spec §4.3).

    The document gives each type of ``payloads`` its own component (``TextPart`` …) and the part a ``oneOf`` with a
    discriminator. The check takes any ``type`` (an unknown one is ``unsupported_content``, a later step's) and
    checks the payload only for the ``checked`` types, where null or absent passes too (it is refused later, as
    ``unsupported_content``); the other payloads are the media decoder's (``invalid_media``).
    """

    payloads: Mapping[str, Shape]
    checked: tuple[str, ...]

    def variants(self) -> dict[str, Named]:
        return {
            kind: Named(
                kind.title().replace("_", "") + "Part",
                Object((Field("type", Const(kind), True), Field(kind, payload, True))),
            )
            for kind, payload in self.payloads.items()
        }

    def check(self, value: object, path: str) -> None:
        _PART.check(value, path)
        kind = value["type"]
        if kind in self.checked:
            Nullable(self.payloads[kind]).check(value.get(kind), f"{path}.{kind}")

    def admits(self, value: object) -> bool:
        return isinstance(value, dict)

    def keywords(self) -> dict:
        variants = self.variants()
        return {
            "oneOf": [variant.json_schema() for variant in variants.values()],
            "discriminator": {
                "propertyName": "type",
                "mapping": {kind: SCHEMAS + variant.name for kind, variant in variants.items()},
            },
        }

    def parts(self) -> Iterator[Shape]:
        return iter(self.variants().values())


_PART = Object((Field("type", String(), True),))


def named_shapes(root: Shape) -> dict[str, Named]:
    """Every `Named` shape inside ``root`` (itself included), by name, each after the shapes it uses."""
    found: dict[str, Named] = {}

    def visit(shape: Shape) -> None:
        for part in shape.parts():
            visit(part)
        if isinstance(shape, Named):
            found.setdefault(shape.name, shape)

    visit(root)
    return found
