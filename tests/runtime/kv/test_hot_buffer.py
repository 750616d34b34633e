"""The HiSparse hot buffer: a step's selection resolves to hits and misses, misses take free
slots then the least recently used ones, a step's positions never evict each other, the map stays
within its slots, and a random run of steps matches a plain LRU model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_runtime.kv.hot_buffer import HotBuffer


def test_first_step_misses_everything_and_fills_free_slots_in_order() -> None:
    buf = HotBuffer(4)
    res = buf.resolve([7, 3, 9])
    assert res.positions == (7, 3, 9)
    assert res.slots == (0, 1, 2)
    assert res.misses == ((7, 0), (3, 1), (9, 2))
    assert res.hits == 0 and len(buf) == 3


def test_repeated_positions_hit_and_keep_their_slots() -> None:
    buf = HotBuffer(4)
    buf.resolve([7, 3, 9])
    res = buf.resolve([9, 7])
    assert res.hits == 2 and res.misses == ()
    assert res.slots == (2, 0)


def test_misses_evict_the_least_recently_used_position_not_asked_for() -> None:
    buf = HotBuffer(3)
    buf.resolve([1, 2, 3])  # LRU order 1, 2, 3
    buf.resolve([1])  # LRU order 2, 3, 1
    res = buf.resolve([4, 3])  # 3 is touched first, so 4 evicts 2 (not 3, not 1)
    assert res.misses == ((4, buf.slot_of(4)),)
    assert buf.slot_of(4) == 1  # 2's old slot
    assert 2 not in buf and 1 in buf and 3 in buf


def test_a_step_never_evicts_its_own_positions_even_when_hits_are_lru() -> None:
    buf = HotBuffer(3)
    buf.resolve([1, 2, 3])
    res = buf.resolve([10, 11, 1])  # 1 is the LRU entry but asked for: 2 and 3 go
    assert dict(zip(res.positions, res.slots, strict=True))[1] == 0
    assert set(res.slots) == {0, 1, 2}
    assert sorted(p for p, _ in res.misses) == [10, 11]


def test_duplicates_count_once() -> None:
    buf = HotBuffer(2)
    res = buf.resolve([5, 5, 6, 5])
    assert res.positions == (5, 6) and len(res.misses) == 2


def test_a_selection_wider_than_the_buffer_is_refused_and_changes_nothing() -> None:
    buf = HotBuffer(2)
    buf.resolve([1])
    with pytest.raises(ValueError, match="3 positions but the hot buffer holds 2 slots"):
        buf.resolve([4, 5, 6])
    assert len(buf) == 1 and buf.slot_of(1) == 0


def test_place_adds_a_device_row_as_most_recent_without_a_miss() -> None:
    buf = HotBuffer(2)
    buf.resolve([1, 2])
    slot = buf.place(3)  # evicts 1
    assert slot == 0 and 1 not in buf
    assert buf.resolve([3, 2]).hits == 2
    assert buf.place(3) == 0  # already there: same slot


def test_clear_frees_every_slot() -> None:
    buf = HotBuffer(2)
    buf.resolve([1, 2])
    buf.clear()
    assert len(buf) == 0
    assert buf.resolve([8]).slots == (0,)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be >= 1 slot"):
        HotBuffer(0)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 8),
    steps=st.lists(st.lists(st.integers(0, 20), max_size=8), max_size=30),
)
def test_random_steps_match_a_plain_lru_model(capacity: int, steps: list[list[int]]) -> None:
    buf = HotBuffer(capacity)
    order: list[int] = []  # the model: LRU first
    for step in steps:
        wanted = list(dict.fromkeys(step))[:capacity]
        res = buf.resolve(wanted)
        model_misses = [p for p in wanted if p not in order]
        for p in wanted:
            if p in order:
                order.remove(p)
                order.append(p)
        for p in model_misses:
            if len(order) == capacity:
                order.pop(0)
            order.append(p)
        assert [p for p, _ in res.misses] == model_misses
        assert list(buf.positions()) == order
        slots = [buf.slot_of(p) for p in order]
        assert len(set(slots)) == len(slots) and all(
            s is not None and 0 <= s < capacity for s in slots
        )
        assert all(buf.slot_of(p) == s for p, s in zip(res.positions, res.slots, strict=True))
