from __future__ import annotations

import random
from collections import Counter

import pytest

from loom_router.core.picker import pick_max, pick_weighted
from loom_router.errors import NoEndpointError


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ({"a": 1.0, "b": 2.0, "c": 0.5}, {"b"}),
        ({"a": 3.0}, {"a"}),
        ({"a": 2.0, "b": 2.0, "c": 1.0}, {"a", "b"}),
        ({"a": 2.0, "b": 2.0 - 1e-12, "c": 1.0}, {"a", "b"}),  # within tolerance: a tie
        ({"a": 0.0, "b": 0.0}, {"a", "b"}),
    ],
)
def test_pick_max_picks_among_the_best(scores: dict[str, float], expected: set[str]) -> None:
    picks = {pick_max(scores, random.Random(seed)) for seed in range(50)}
    assert picks == expected  # every tied best is reachable, nothing else is


def test_tie_break_depends_only_on_the_seed_not_on_dict_order() -> None:
    forward = {"a": 1.0, "b": 1.0, "c": 1.0}
    backward = dict(reversed(list(forward.items())))
    for seed in range(20):
        assert pick_max(forward, random.Random(seed)) == pick_max(backward, random.Random(seed))


def test_pick_weighted_follows_the_scores() -> None:
    rng = random.Random(7)
    counts = Counter(pick_weighted({"a": 3.0, "b": 1.0, "c": 0.0}, rng) for _ in range(4000))
    assert counts["c"] == 0
    assert 2700 < counts["a"] < 3300  # about 3/4
    assert counts["a"] + counts["b"] == 4000


def test_pick_weighted_is_uniform_when_all_zero() -> None:
    rng = random.Random(1)
    counts = Counter(pick_weighted({"a": 0.0, "b": 0.0}, rng) for _ in range(1000))
    assert set(counts) == {"a", "b"}


def test_empty_scores_are_a_typed_error() -> None:
    with pytest.raises(NoEndpointError):
        pick_max({}, random.Random(0))
    with pytest.raises(NoEndpointError):
        pick_weighted({}, random.Random(0))
