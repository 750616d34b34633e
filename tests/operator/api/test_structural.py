"""pydantic schema -> structural schema, and the checker that rejects non-structural ones."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import ConfigDict, Field

from loom_operator.api.structural import structural_schema
from loom_operator.api.structural_check import structural_problems
from loom_runtime.card.base import CardModel, cel_rules


class _Leaf(CardModel):
    """A leaf."""

    size: int = Field(default=4, ge=1)
    """How big."""


class _Root(CardModel):
    """The root."""

    model_config = ConfigDict(json_schema_extra=cel_rules(("self.count >= 0", "count >= 0")))

    leaf: _Leaf
    """Required leaf."""
    maybe: _Leaf | None = None
    """Optional leaf."""
    fixed: Literal["only"] = "only"
    ratio: float = Field(default=1.0, gt=0)
    count: int = 0
    by_role: dict[Literal["prefill", "decode"], int] = Field(default_factory=dict)


def test_refs_are_inlined_and_optional_becomes_nullable() -> None:
    schema = structural_schema(_Root)
    leaf, maybe = schema["properties"]["leaf"], schema["properties"]["maybe"]
    assert leaf["properties"]["size"] == {
        "default": 4,
        "description": "How big.",
        "minimum": 1,
        "type": "integer",
    }
    assert leaf["description"] == "Required leaf."  # the field's words win over the class's
    assert maybe["nullable"] is True and maybe["type"] == "object"
    assert "default" not in maybe and "anyOf" not in maybe
    assert schema["required"] == ["leaf"]


def test_json_schema_2020_forms_become_openapi_v3() -> None:
    props = structural_schema(_Root)["properties"]
    assert props["fixed"]["enum"] == ["only"] and "const" not in props["fixed"]
    assert (props["ratio"]["minimum"], props["ratio"]["exclusiveMinimum"]) == (0, True)
    rules = props["byRole"]["x-kubernetes-validations"]
    assert rules[0]["rule"] == "self.all(k, k in ['prefill', 'decode'])"
    assert "propertyNames" not in props["byRole"]


def test_converted_schema_is_structural_and_keeps_cel_rules() -> None:
    schema = structural_schema(_Root)
    assert structural_problems(schema) == []
    assert schema["x-kubernetes-validations"] == [
        {"rule": "self.count >= 0", "message": "count >= 0"}
    ]
    assert "additionalProperties" not in schema and "title" not in schema


def test_real_unions_are_refused() -> None:
    class _Union(CardModel):
        value: int | str

    with pytest.raises(ValueError, match="not structural"):
        structural_schema(_Union)


GOOD: dict[str, Any] = {
    "type": "object",
    "properties": {
        "metadata": {"type": "object"},
        "spec": {"type": "object", "properties": {"n": {"type": "integer", "default": 1}}},
    },
}

BROKEN: list[tuple[str, dict[str, Any], str]] = [
    ("no type", {"description": "x"}, "needs a type"),
    ("ref", {"$ref": "#/$defs/X", "type": "object"}, "$ref is not structural"),
    ("null union", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "anyOf outside"),
    ("const", {"type": "string", "const": "a"}, "const is not structural"),
    (
        "closed object",
        {"type": "object", "properties": {}, "additionalProperties": False},
        "exclude each other",
    ),
    ("numeric exclusive bound", {"type": "number", "exclusiveMinimum": 0}, "exclusiveMinimum"),
    ("default of the wrong type", {"type": "integer", "default": "1"}, "does not fit"),
    (
        "default outside the enum",
        {"type": "string", "enum": ["a"], "default": "b"},
        "not in the enum",
    ),
    ("null default", {"type": "integer", "default": None}, "does not fit"),
    (
        "required but absent",
        {"type": "object", "properties": {}, "required": ["x"]},
        "not a property",
    ),
    ("array without items", {"type": "array"}, "needs one items"),
    (
        "list map key not required",
        {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
        "list-map keys",
    ),
    (
        "cel refers to a missing field",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "x-kubernetes-validations": [{"rule": "self.b > 0", "message": "m"}],
        },
        "unknown field self.b",
    ),
    ("nullable not boolean", {"type": "string", "nullable": "yes"}, "nullable must be"),
    (
        "int-or-string with a type",
        {"type": "string", "x-kubernetes-int-or-string": True},
        "int-or-string",
    ),
]


def test_the_good_schema_passes() -> None:
    assert structural_problems(GOOD) == []


@pytest.mark.parametrize(("node", "complaint"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_checker_finds_each_violation(node: dict[str, Any], complaint: str) -> None:
    schema = {**GOOD, "properties": {**GOOD["properties"], "bad": node}}
    problems = structural_problems(schema)
    assert problems and all(p.startswith("openAPIV3Schema.bad") for p in problems)
    assert any(complaint in p for p in problems), problems


def test_metadata_may_only_be_a_plain_object() -> None:
    schema = {**GOOD, "properties": {"metadata": {"type": "object", "properties": {}}}}
    assert structural_problems(schema) == ["openAPIV3Schema.metadata: may only be {type: object}"]
