from __future__ import annotations

import math

import pytest

from loom_router.core.scorers.contract import clamp, lower_is_better


@pytest.mark.parametrize(
    ("value", "expected"),
    [(-1.0, 0.0), (0.0, 0.0), (0.3, 0.3), (1.0, 1.0), (7.0, 1.0), (math.nan, 0.0), (math.inf, 1.0)],
)
def test_clamp(value: float, expected: float) -> None:
    assert clamp(value) == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"a": 0, "b": 10}, {"a": 1.0, "b": 0.0, "c": 0.5}),  # c unknown: the fleet mean
        ({"a": 2, "b": 4, "c": 3}, {"a": 1.0, "b": 0.0, "c": 0.5}),
        ({"a": 5, "b": 5, "c": 5}, {"a": 1.0, "b": 1.0, "c": 1.0}),  # all equal: all best
        ({"a": 5}, {"a": 1.0, "b": 1.0, "c": 1.0}),  # b, c unknown: as loaded as a
        ({"a": 0, "b": 8, "c": 1}, {"a": 1.0, "b": 0.0, "c": 0.875}),
        ({}, {"a": 0.0, "b": 0.0, "c": 0.0}),  # nothing known
    ],
)
def test_lower_is_better(values: dict[str, float], expected: dict[str, float]) -> None:
    assert lower_is_better(("a", "b", "c"), values) == expected
