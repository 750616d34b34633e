"""EP's expert placement (contiguous blocks of E/W experts per rank) and dispatch order (the
(token, slot) pairs grouped by their expert's rank, in pair order inside each group)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from loom_runtime.parallel.experts import ExpertPlacement, plan_dispatch
from loom_runtime.parallel.layout import LayoutError


@pytest.mark.parametrize(
    ("experts", "world", "owners"),
    [
        (8, 2, [0, 0, 0, 0, 1, 1, 1, 1]),
        (8, 4, [0, 0, 1, 1, 2, 2, 3, 3]),
        (8, 1, [0] * 8),
        (256, 8, [e // 32 for e in range(256)]),  # GLM-5's 256 routed experts over EP 8
    ],
)
def test_each_rank_owns_a_contiguous_block(experts: int, world: int, owners: list[int]) -> None:
    placement = ExpertPlacement(experts, world)
    assert [placement.owner(e) for e in range(experts)] == owners
    assert [e for r in range(world) for e in placement.local(r)] == list(range(experts))


def test_experts_that_do_not_split_evenly_are_refused() -> None:
    with pytest.raises(LayoutError, match=r"ep \(3\) must divide the model's n_routed_experts"):
        ExpertPlacement(8, 3)


def test_dispatch_groups_pairs_by_owner_in_pair_order() -> None:
    routing = torch.tensor([[5, 1], [0, 7], [2, 6]])  # pairs 0..5 -> owners 1,0,0,1,0,1
    dispatch = plan_dispatch(routing, ExpertPlacement(8, 2))
    assert dispatch.order.tolist() == [1, 2, 4, 0, 3, 5]
    assert dispatch.counts == (3, 3)


@given(
    tokens=st.integers(0, 50),
    k=st.integers(1, 4),
    world=st.sampled_from([1, 2, 4, 8]),
    seed=st.integers(0, 1000),
)
def test_dispatch_sends_every_pair_once_to_its_owner(
    tokens: int, k: int, world: int, seed: int
) -> None:
    placement = ExpertPlacement(16, world)
    gen = torch.Generator().manual_seed(seed)
    routing = torch.randint(16, (tokens, k), generator=gen)
    dispatch = plan_dispatch(routing, placement)
    assert sorted(dispatch.order.tolist()) == list(range(tokens * k))
    assert sum(dispatch.counts) == tokens * k
    flat = routing.reshape(-1)[dispatch.order].tolist()
    start = 0
    for rank, count in enumerate(dispatch.counts):
        assert all(placement.owner(e) == rank for e in flat[start : start + count])
        chunk = dispatch.order[start : start + count].tolist()
        assert chunk == sorted(chunk)
        start += count
