"""Each kind of shape checks exactly what its JSON Schema says (`spinf.protocol.shapes`), and reports where.

For every kind, with bounds, random JSON values must pass `Shape.check` exactly when the shape's own JSON Schema
(under the strict integer reading of `tests.protocol.document`) accepts them, and a refusal names a location
inside the value. `Parts` checks less than its schema on purpose, so it has its own test.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spinf.errors import ApiError
from spinf.protocol import shapes as sh
from tests.protocol.bodies import FIXED
from tests.protocol.document import validator

SHAPES = {
    "boolean": sh.Boolean(),
    "string": sh.String(min_chars=1, max_chars=3),
    "integer": sh.Integer(1, 5),
    "integer-at-least": sh.Integer(0),
    "number": sh.Number(),
    "number-bounded": sh.Number(0, 2),
    "number-above": sh.Number(0, 1, above_lo=True),
    "const": sh.Const("all"),
    "enum": sh.Enum(("a", "b")),
    "nullable": sh.Nullable(sh.String(max_chars=2)),
    "list": sh.ListOf(sh.Integer(0, 9), 1),
    "map": sh.MapOf(sh.Boolean()),
    "object": sh.Object((sh.Field("a", sh.Integer(0, 1), True), sh.Field("b", sh.String())), closed=True),
    "open-object": sh.Object((sh.Field("a", sh.Nullable(sh.Boolean())),)),
    "union": sh.Union((sh.String(), sh.ListOf(sh.Boolean())), expected="a string or a list of booleans"),
    "nullable-union": sh.Nullable(
        sh.Union((sh.Boolean(), sh.Object((sh.Field("n", sh.Integer(1, 6)),))), expected="a flag or an object")
    ),
}
scalars = st.sampled_from([None, True, False, 0, 1, 2, 5, 6, -1, 0.0, 0.5, 1.0, 2.0, 2.5, "", "a", "b", "all", "abcd"])
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "n", "x"]), inner, max_size=3)
    ),
    max_leaves=6,
)


@pytest.mark.parametrize("name", list(SHAPES))
@settings(FIXED, max_examples=300)
@given(value=values)
def test_a_shape_checks_what_its_json_schema_says(name, value):
    shape = SHAPES[name]
    try:
        shape.check(value, "x")
    except ApiError as e:
        assert (e.status, e.code) == (400, "invalid_field") and (e.param == "x" or e.param.startswith("x."))
        assert not validator(shape.json_schema()).is_valid(value), e
    else:
        assert validator(shape.json_schema()).is_valid(value)


def test_doc_and_elsewhere_keywords_go_into_the_document_only():
    shape = sh.ListOf(sh.String(elsewhere={"minLength": 1}), elsewhere={"minItems": 1}, doc={"description": "d"})
    assert shape.json_schema() == {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1} | {
        "description": "d"
    }
    shape.check([], "x")
    shape.check([""], "x")


def test_a_nullable_union_is_one_any_of():
    shape = sh.Nullable(sh.Union((sh.Boolean(), sh.Const("all")), expected="a flag or all"))
    assert shape.json_schema() == {"anyOf": [{"type": "boolean"}, {"const": "all"}, {"type": "null"}]}


def test_a_part_checks_its_type_and_only_the_checked_payloads(refused):
    parts = sh.Parts(
        {"text": sh.String(), "image_url": sh.Object((sh.Field("url", sh.String(), True),))}, checked=("text",)
    )
    for fine in ({"type": "text", "text": "t"}, {"type": "text"}, {"type": "text", "text": None}, {"type": "new"}):
        parts.check(fine, "p")  # a missing payload or an unknown type is a later step's unsupported_content
    parts.check({"type": "image_url", "image_url": 5}, "p")  # media payloads are the media decoder's
    refused(lambda: parts.check({"type": "text", "text": 5}, "p"), "invalid_field", "p.text")
    refused(lambda: parts.check({"type": 5}, "p"), "invalid_field", "p.type")
    refused(lambda: parts.check({}, "p"), "invalid_field", "p.type")
    refused(lambda: parts.check("text", "p"), "invalid_field", "p")
    schema = parts.json_schema()
    assert schema["discriminator"]["mapping"] == {
        "text": "#/components/schemas/TextPart",
        "image_url": "#/components/schemas/ImageUrlPart",
    }
    assert [v["$ref"] for v in schema["oneOf"]] == list(schema["discriminator"]["mapping"].values())


def test_named_shapes_are_found_once_each_after_the_shapes_they_use():
    leaf = sh.Named("Leaf", sh.String())
    root = sh.Named("Root", sh.Object((sh.Field("a", leaf), sh.Field("b", sh.ListOf(leaf)))))
    assert list(sh.named_shapes(root)) == ["Leaf", "Root"]
    assert root.json_schema() == {"$ref": "#/components/schemas/Root"}
    assert sh.named_shapes(root)["Root"].shape.json_schema()["properties"]["b"] == {
        "type": "array",
        "items": {"$ref": "#/components/schemas/Leaf"},
    }
