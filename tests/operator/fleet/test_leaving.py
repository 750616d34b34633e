"""Which workers stay when a role grows or shrinks: new ones take the lowest free indices, the
least busy leave (ties: the highest index)."""

from __future__ import annotations

import pytest

from loom_operator.fleet.leaving import kept_indices

CASES = [
    # (current, desired, busy, kept)
    ((0, 1, 2), 2, {0: 3, 1: 0, 2: 5}, (0, 2)),  # the idle middle one leaves, not index 2
    ((0, 1, 2), 2, {}, (0, 1)),  # all idle: the highest index leaves, as before
    ((0, 1, 2), 1, {0: 1, 1: 1, 2: 0}, (0,)),  # 2 is idle, then 0 and 1 tie: 1 (higher) leaves
    ((0, 2), 3, {}, (0, 1, 2)),  # growing fills the hole first
    ((0, 2), 4, {}, (0, 1, 2, 3)),
    ((), 2, {}, (0, 1)),  # from zero
    ((0, 1), 0, {0: 9}, ()),  # to zero
    ((1, 3), 2, {1: 0, 3: 0}, (1, 3)),  # unchanged
]


@pytest.mark.parametrize(("current", "desired", "busy", "kept"), CASES)
def test_the_least_busy_leave_and_new_workers_take_the_lowest_free_indices(
    current: tuple[int, ...], desired: int, busy: dict[int, int], kept: tuple[int, ...]
) -> None:
    assert kept_indices(current, desired, busy) == kept
