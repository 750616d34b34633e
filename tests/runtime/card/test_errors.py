"""FieldError paths and the conversion of pydantic errors to camelCase field paths."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from loom_runtime.card.base import CardModel
from loom_runtime.card.errors import CardError, FieldError, field_errors, format_path


class _Inner(CardModel):
    block_size: int = Field(ge=1)


class _Outer(CardModel):
    roles: list[_Inner]
    by_name: dict[str, _Inner] = Field(default_factory=dict)


@pytest.mark.parametrize(
    ("parts", "path"),
    [
        (("spec", "loops", 1, "components", 0), "spec.loops[1].components[0]"),
        (("spec", "recipe", "assumesLoop"), "spec.recipe.assumesLoop"),
        ((), ""),
        (
            ("metadata", "labels", "app.kubernetes.io/name"),
            "metadata.labels['app.kubernetes.io/name']",
        ),
    ],
)
def test_format_path_joins_keys_and_indexes(parts: tuple[str | int, ...], path: str) -> None:
    assert format_path(parts) == path


def test_field_errors_lists_every_pydantic_error_with_camel_case_paths() -> None:
    with pytest.raises(ValidationError) as info:
        _Outer.model_validate({"roles": [{"blockSize": 0}, {"blockSize": "16"}], "typo": 1})
    errors = field_errors(info.value, prefix=("spec",))
    assert [e.path for e in errors] == [
        "spec.roles[0].blockSize",
        "spec.roles[1].blockSize",
        "spec.typo",
    ]
    assert errors[0].code == "greater_than_equal"
    assert "(got 1)" in errors[2].message  # unknown fields show what was written


def test_card_error_message_lists_all_errors_with_their_source() -> None:
    err = CardError(
        [
            FieldError("spec.family", "bad family", source="cards.yaml:1"),
            FieldError("", "not valid YAML", source="other.yaml"),
        ]
    )
    assert str(err).splitlines() == [
        "cards.yaml:1: spec.family: bad family",
        "other.yaml: not valid YAML",
    ]
    assert len(err.errors) == 2
