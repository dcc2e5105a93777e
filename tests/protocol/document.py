"""The request schemas of the served OpenAPI document (``GET /openapi.json``), as validators for the protocol tests.

Validation is JSON Schema 2020-12 with one change: an integer is an ``int`` of the decoded body, so ``16.0`` is not
one. That is how the parser reads "integer" (strict JSON types); JSON Schema cannot tell the two apart, so the
document cannot say it. Every ``$ref`` is made absolute, so any part of the document validates on its own.
"""

from __future__ import annotations

from jsonschema import Draft202012Validator, validators
from referencing import Registry
from referencing.jsonschema import DRAFT202012

import spinf
from spinf.server.openapi import openapi_document

URI = "urn:spinf:openapi"
LOCAL = "#/components/schemas/"


def _absolute(value: object) -> object:
    if isinstance(value, dict):
        return {k: URI + v if k == "$ref" else _absolute(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_absolute(v) for v in value]
    return value


DOC = _absolute(openapi_document(spinf.__version__))
COMPONENTS: dict[str, dict] = DOC["components"]["schemas"]
REGISTRY = Registry().with_resource(URI, DRAFT202012.create_resource(DOC))
_STRICT_TYPES = Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
)
Strict = validators.extend(Draft202012Validator, type_checker=_STRICT_TYPES)


def validator(schema: dict) -> Draft202012Validator:
    return Strict(schema, registry=REGISTRY)


def component(name: str) -> Draft202012Validator:
    return validator({"$ref": URI + LOCAL + name})


SCORE_REQUEST = component("ScoreRequest")
CHAT_REQUEST = component("ChatRequest")


def deref(schema: dict, where: str) -> tuple[dict, str]:
    """Follow ``$ref`` to the schema it names; ``where`` names the schema (a component name, or a path from one)."""
    while "$ref" in schema:
        where = schema["$ref"].removeprefix(URI + LOCAL)
        schema = COMPONENTS[where]
    return schema, where


def describing(schema: dict, where: str, value: object) -> tuple[dict, str]:
    """The schema that describes ``value``: through ``$ref``, and into the union branch that ``value`` validates
    against (the first; the last when none does, so a wrong value still has a place)."""
    schema, where = deref(schema, where)
    union = schema.get("anyOf", schema.get("oneOf"))
    if union is None or "type" in schema:  # ScoreRequest's oneOf only picks the form; it is not a union of shapes
        return schema, where
    k = next((k for k, branch in enumerate(union) if validator(branch).is_valid(value)), len(union) - 1)
    return describing(union[k], f"{where}|{k}", value)
