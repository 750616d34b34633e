"""Rules run inside validation: on a valid model, and on the valid parts of a broken one."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import Field, ValidationError, model_validator
from pydantic.functional_validators import ModelWrapValidatorHandler

from loom_runtime.card.base import CardModel
from loom_runtime.card.checks import validate_with_rules
from loom_runtime.card.errors import Problem, field_errors


class Part(CardModel):
    size: int = Field(default=16, ge=1)
    name: str = "p"


def _size_rule(model: Any) -> list[Problem]:
    a, b = model.left.size, model.right.size
    return [] if a == b else [(("right", "size"), "mismatch", f"{b} != {a}")]


def _count_rule(model: Any) -> list[Problem]:
    return [] if model.count > 0 else [(("count",), "too_small", "count must be positive")]


class Pair(CardModel):
    left: Part = Field(default_factory=Part)
    right: Part = Field(default_factory=Part)
    count: int = 1
    label: str = ""

    @model_validator(mode="wrap")
    @classmethod
    def _check(cls, data: object, handler: ModelWrapValidatorHandler[Pair]) -> Pair:
        return validate_with_rules(cls, data, handler, (_size_rule, _count_rule))


class Outer(CardModel):
    pairs: list[Pair]


def _found(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        Outer.model_validate(data)
    return [(e.path, e.code) for e in field_errors(info.value)]


def test_rules_pass_on_a_valid_model() -> None:
    assert Outer.model_validate({"pairs": [{"count": 2}]}).pairs[0].count == 2


def test_rule_problems_carry_their_full_path() -> None:
    data = {"pairs": [{}, {"left": {"size": 8}, "count": 0}]}
    assert _found(data) == [("pairs[1].right.size", "mismatch"), ("pairs[1].count", "too_small")]


def test_rules_on_valid_fields_still_run_when_another_field_fails() -> None:
    data = {"pairs": [{"left": {"size": 8}, "label": 5}]}
    assert _found(data) == [("pairs[0].label", "string_type"), ("pairs[0].right.size", "mismatch")]


def test_rules_run_on_the_valid_parts_of_a_broken_sub_model() -> None:
    # right.name is wrong, right.size is fine: the size rule still sees both sizes.
    data = {"pairs": [{"left": {"size": 8}, "right": {"size": 4, "name": 1}}]}
    assert _found(data) == [
        ("pairs[0].right.name", "string_type"),
        ("pairs[0].right.size", "mismatch"),
    ]


def test_a_rule_reading_a_broken_field_is_skipped_not_misled() -> None:
    # right.size is invalid: the default (16) must not stand in for it and fake a match or
    # a mismatch; only the type error is reported, plus the unrelated count rule.
    data = {"pairs": [{"left": {"size": 8}, "right": {"size": "8"}, "count": 0}]}
    assert _found(data) == [("pairs[0].right.size", "int_type"), ("pairs[0].count", "too_small")]


def test_partial_values_keep_field_constraints() -> None:
    # size 0 violates ge=1; the rule must not see it as a value (it would report 0 != 8).
    data = {"pairs": [{"left": {"size": 8}, "right": {"size": 0}}]}
    assert _found(data) == [("pairs[0].right.size", "greater_than_equal")]
