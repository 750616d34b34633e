"""The group layout of a role: which global ranks form each TP, PCP, DCP and EP group, by
table for the reference deployment's shapes, and as a property for every valid layout; the
layout rules are the DeploymentCard's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom_operator.api.roles import Parallelism
from loom_runtime.card.load import parse_card
from loom_runtime.parallel.layout import LayoutError, ParallelLayout

R8 = tuple(range(8))
ONES8 = tuple((r,) for r in R8)


@pytest.mark.parametrize(
    ("layout", "tp", "pcp", "dcp", "ep"),
    [
        # The reference prefill node: PCP 8 × DCP 8 × EP 8 on the same 8 GPUs.
        (ParallelLayout(pcp=8, dcp=8, ep=8), ONES8, (R8,), (R8,), (R8,)),
        # The reference decode node: 8 DP ranks sharing EP 8.
        (ParallelLayout(dp=8, ep=8), ONES8, ONES8, ONES8, (R8,)),
        (ParallelLayout(pcp=2, dcp=2, ep=2), ((0,), (1,)), ((0, 1),), ((0, 1),), ((0, 1),)),
        (
            ParallelLayout(tp=2, pcp=2, dcp=2),
            ((0, 1), (2, 3)),
            ((0, 2), (1, 3)),
            ((0, 1), (2, 3)),
            ((0,), (1,), (2,), (3,)),
        ),
        (
            ParallelLayout(pcp=4, dcp=2, ep=4),
            tuple((r,) for r in range(4)),
            ((0, 1, 2, 3),),
            ((0, 1), (2, 3)),
            ((0, 1, 2, 3),),
        ),
        (
            ParallelLayout(dp=2, tp=2, ep=4),
            ((0, 1), (2, 3)),
            ((0,), (1,), (2,), (3,)),
            ((0,), (1,), (2,), (3,)),
            ((0, 1, 2, 3),),
        ),
    ],
)
def test_groups_of_the_reference_shapes(
    layout: ParallelLayout,
    tp: tuple[tuple[int, ...], ...],
    pcp: tuple[tuple[int, ...], ...],
    dcp: tuple[tuple[int, ...], ...],
    ep: tuple[tuple[int, ...], ...],
) -> None:
    groups = layout.groups()
    assert (groups.tp, groups.pcp, groups.dcp, groups.ep) == (tp, pcp, dcp, ep)


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"pcp": 2, "dp": 2}, "pcp > 1 cannot be combined with dp > 1"),
        ({"pcp": 2, "dcp": 4}, r"dcp \(4\) must divide tp × pcp \(2\)"),
        ({"dp": 4, "ep": 3}, r"ep \(3\) must divide dp × tp × pcp \(4\)"),
        ({"interleave": 4}, "interleave only applies"),
        ({"tp": 0}, "tp must be >= 1"),
    ],
)
def test_a_layout_the_ranks_cannot_form_is_refused_saying_why(
    fields: dict[str, int], complaint: str
) -> None:
    with pytest.raises(LayoutError, match=complaint):
        ParallelLayout(**fields)


def test_a_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(LayoutError, match="rank 2 is outside a world of 2"):
        ParallelLayout(pcp=2).coords(2)


sizes = st.sampled_from([1, 2, 3, 4, 8])


@given(dp=sizes, tp=sizes, pcp=sizes, dcp=sizes, ep=sizes, interleave=st.sampled_from([1, 4]))
def test_the_layout_accepts_exactly_what_the_deployment_card_accepts(
    dp: int, tp: int, pcp: int, dcp: int, ep: int, interleave: int
) -> None:
    fields = {"dp": dp, "tp": tp, "pcp": pcp, "dcp": dcp, "ep": ep}
    try:
        parse_card(Parallelism, {**fields, "cpKvInterleave": interleave})
        card_ok = True
    except Exception:
        card_ok = False
    try:
        ParallelLayout(**fields, interleave=interleave)
        layout_ok = True
    except LayoutError:
        layout_ok = False
    assert layout_ok == card_ok


@given(dp=sizes, tp=sizes, pcp=sizes, dcp=sizes, ep=sizes)
def test_every_kind_of_group_partitions_the_world_and_coords_index_into_it(
    dp: int, tp: int, pcp: int, dcp: int, ep: int
) -> None:
    try:
        layout = ParallelLayout(dp=dp, tp=tp, pcp=pcp, dcp=dcp, ep=ep)
    except LayoutError:
        return
    groups = layout.groups()
    for kind, size in (("tp", tp), ("pcp", pcp), ("dcp", dcp), ("ep", ep)):
        members = [r for g in getattr(groups, kind) for r in g]
        assert sorted(members) == list(range(layout.world))
        assert all(len(g) == size for g in getattr(groups, kind))
    for rank in range(layout.world):
        c = layout.coords(rank)
        assert groups.of("tp", rank)[c.tp] == rank
        assert groups.of("pcp", rank)[c.pcp] == rank
        assert groups.of("dcp", rank)[c.dcp] == rank
        assert groups.of("ep", rank)[c.ep] == rank
        # A DCP group never spans two replicas: its ranks share the dp coordinate.
        assert {layout.coords(r).dp for r in groups.of("dcp", rank)} == {c.dp}
