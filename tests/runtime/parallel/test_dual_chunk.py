"""PCP's DualChunkSwap: 2N chunks, rank r takes chunks r and 2N−1−r; every token goes to one
rank, the gather restores token order, and every rank does the same causal work."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_runtime.parallel.dual_chunk import DualChunkPlan, chunk_bounds, rank_tokens


@pytest.mark.parametrize(
    ("length", "world", "shares"),
    [
        (8, 2, ((0, 1, 6, 7), (2, 3, 4, 5))),
        (12, 3, ((0, 1, 10, 11), (2, 3, 8, 9), (4, 5, 6, 7))),
        (5, 2, ((0, 1, 4), (2, 3))),  # 4 chunks of 2, 1, 1, 1
        (3, 2, ((0,), (1, 2))),  # 4 chunks of 1, 1, 1, 0
        (0, 2, ((), ())),
        (6, 1, ((0, 1, 2, 3, 4, 5),)),
    ],
)
def test_rank_r_takes_chunks_r_and_2n_minus_1_minus_r(
    length: int, world: int, shares: tuple[tuple[int, ...], ...]
) -> None:
    assert DualChunkPlan.of(length, world).shares == shares


def test_chunks_are_as_even_as_can_be() -> None:
    assert chunk_bounds(10, 2) == ((0, 3), (3, 6), (6, 8), (8, 10))


def test_a_rank_outside_the_group_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 is outside a PCP group of 2"):
        rank_tokens(8, 2, 2)


@settings(deadline=None)
@given(length=st.integers(0, 3000), world=st.integers(1, 8))
def test_the_shares_partition_the_prompt_and_the_gather_is_restored(
    length: int, world: int
) -> None:
    plan = DualChunkPlan.of(length, world)
    gathered, restore = plan.gathered, plan.restore
    assert sorted(gathered) == list(range(length))
    assert [gathered[restore[t]] for t in range(length)] == list(range(length))
    assert max(plan.counts) - min(plan.counts) <= 1
    assert all(list(s) == sorted(s) for s in plan.shares)  # each rank's rows in token order


@given(chunk=st.integers(0, 200), world=st.integers(1, 8))
def test_every_rank_does_the_same_causal_work_when_the_chunks_are_equal(
    chunk: int, world: int
) -> None:
    plan = DualChunkPlan.of(2 * world * chunk, world)
    work = {sum(t + 1 for t in share) for share in plan.shares}  # query t attends t + 1 rows
    assert len(work) == 1
