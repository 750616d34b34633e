"""DCP's token ownership: token t on rank (t // I) mod W; the local-length formula of
REFERENCE.md §A agrees with counting, with the capacity planner, and with the slot map."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_operator.fleet.capacity import dcp_local_length as planner_local_length
from loom_runtime.parallel.dcp_shard import (
    ShardMap,
    global_position,
    local_length,
    local_slot,
    owner,
)


@pytest.mark.parametrize(
    ("world", "interleave", "owners"),
    [
        (2, 1, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]),
        (2, 4, [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]),
        (3, 2, [0, 0, 1, 1, 2, 2, 0, 0, 1, 1]),
    ],
)
def test_token_t_lives_on_rank_t_div_i_mod_w(
    world: int, interleave: int, owners: list[int]
) -> None:
    assert [owner(t, world, interleave) for t in range(10)] == owners


@pytest.mark.parametrize(
    ("length", "world", "interleave", "lengths"),
    [
        (10, 2, 1, [5, 5]),
        (10, 2, 4, [6, 4]),
        (11, 2, 4, [7, 4]),
        (3, 4, 1, [1, 1, 1, 0]),
        (1 << 20, 8, 1, [1 << 17] * 8),  # the reference's 1M tokens over DCP 8
    ],
)
def test_local_lengths(length: int, world: int, interleave: int, lengths: list[int]) -> None:
    assert [local_length(length, world, interleave, r) for r in range(world)] == lengths


@settings(deadline=None)
@given(
    length=st.integers(0, 5000),
    world=st.integers(1, 8),
    interleave=st.sampled_from([1, 2, 4, 16, 64]),
)
def test_the_formula_counts_the_owned_tokens_and_equals_the_planner(
    length: int, world: int, interleave: int
) -> None:
    counts = [0] * world
    for t in range(length):
        counts[owner(t, world, interleave)] += 1
    for rank in range(world):
        assert local_length(length, world, interleave, rank) == counts[rank]
        assert planner_local_length(length, world, interleave, rank) == counts[rank]
    assert max(counts) == counts[0]  # rank 0 is the most loaded (the planner's assumption)


@settings(deadline=None)
@given(
    length=st.integers(0, 3000),
    world=st.integers(1, 8),
    interleave=st.sampled_from([1, 3, 4, 16]),
)
def test_each_rank_stores_its_tokens_in_order_in_slots_0_to_n(
    length: int, world: int, interleave: int
) -> None:
    for rank in range(world):
        shard = ShardMap(world, interleave, rank)
        owned = shard.owned(0, length)
        assert [local_slot(t, world, interleave) for t in owned] == list(range(len(owned)))
        assert shard.positions(len(owned)) == owned
        assert all(
            global_position(local_slot(t, world, interleave), world, interleave, rank) == t
            for t in owned
        )


@given(
    start=st.integers(0, 500),
    new=st.integers(0, 100),
    world=st.integers(1, 4),
    interleave=st.sampled_from([1, 4]),
)
def test_a_forward_appends_exactly_its_owned_tokens(
    start: int, new: int, world: int, interleave: int
) -> None:
    for rank in range(world):
        shard = ShardMap(world, interleave, rank)
        grown = shard.local_length(start + new) - shard.local_length(start)
        assert len(shard.owned(start, start + new)) == grown
