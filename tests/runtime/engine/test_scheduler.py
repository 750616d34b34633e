"""The pure scheduler: decode first, chunked prefill under the budget, preemption of the newest,
FIFO admission that reserves blocks, and the invariants every decision keeps."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_runtime.engine.scheduler import (
    RunningSeq,
    ScheduledChunk,
    StepLimits,
    WaitingSeq,
    blocks_for,
    schedule,
)

BS = 4


def run(rid: str, n: int, ctx: int, held: int | None = None, free: int | None = None) -> RunningSeq:
    held = blocks_for(ctx + (0 if n == 1 else n), BS) if held is None else held
    return RunningSeq(rid, n, ctx, held, held if free is None else free)


def wait(rid: str, n: int, cached: int = 0, blocks: int | None = None) -> WaitingSeq:
    return WaitingSeq(rid, n, cached, blocks_for(n, BS) if blocks is None else blocks)


def limits(budget: int = 100, seqs: int = 8, free: int = 100) -> StepLimits:
    return StepLimits(token_budget=budget, max_num_seqs=seqs, free_blocks=free, block_size=BS)


CASES = [
    pytest.param(
        # running prefill listed first still runs after the decodes; admission fills the rest
        [run("p", 10, 4), run("d1", 1, 5), run("d2", 1, 6)],
        [wait("w", 20)],
        limits(budget=8),
        [("d1", 1, 0), ("d2", 1, 0), ("p", 6, 0)],
        [],
        [],
        id="decodes-first-then-prefill-chunk",
    ),
    pytest.param(
        [],
        [wait("a", 100)],
        limits(budget=32),
        [("a", 32, 0)],
        [],
        ["a"],
        id="long-prompt-chunked-to-budget",
    ),
    pytest.param(
        [],
        [wait("a", 40, cached=32, blocks=2)],
        limits(budget=32),
        [("a", 8, 0)],
        [],
        ["a"],
        id="cached-prefix-is-not-recomputed",
    ),
    pytest.param(
        [run("d", 1, 4, held=1)],
        [wait("w", 3)],
        limits(budget=10, free=1),
        [("d", 1, 1)],
        [],
        [],
        id="decode-growth-takes-the-last-block-before-admission",
    ),
    pytest.param(
        [run("old", 1, 8, held=2), run("new", 1, 4, held=1)],
        [],
        limits(free=0),
        [("old", 1, 1)],
        ["new"],
        [],
        id="newest-preempted-to-fund-oldest",
    ),
    pytest.param(
        [run("old", 1, 6, held=2), run("new", 1, 4, held=1)],
        [wait("w", 1, blocks=0)],
        limits(free=0),
        [("old", 1, 0)],
        ["new"],
        [],
        id="newest-preempts-itself-and-nothing-is-admitted",
    ),
    pytest.param(
        [run("a", 1, 8, held=2, free=0), run("b", 1, 8, held=2, free=0), run("c", 1, 4, held=1)],
        [],
        limits(free=0),
        [("a", 1, 1)],
        ["c", "b"],
        [],
        id="shared-blocks-free-nothing-so-more-victims",
    ),
    pytest.param(
        [],
        [wait("big", 40, blocks=10), wait("small", 4, blocks=1)],
        limits(free=5),
        [],
        [],
        [],
        id="fifo-head-of-line-is-not-skipped",
    ),
    pytest.param(
        [run("r1", 1, 3), run("r2", 1, 3)],
        [wait("a", 2), wait("b", 2)],
        limits(seqs=3),
        [("r1", 1, 0), ("r2", 1, 0), ("a", 2, 0)],
        [],
        ["a"],
        id="max-num-seqs-caps-admission",
    ),
    pytest.param(
        [run("r1", 1, 3), run("r2", 1, 3), run("r3", 1, 3)],
        [wait("a", 2)],
        limits(budget=2),
        [("r1", 1, 0), ("r2", 1, 0)],
        [],
        [],
        id="budget-exhausted-by-decodes",
    ),
]


@pytest.mark.parametrize(("running", "waiting", "lim", "chunks", "preempted", "admitted"), CASES)
def test_schedule_table(
    running: list[RunningSeq],
    waiting: list[WaitingSeq],
    lim: StepLimits,
    chunks: list[tuple[str, int, int]],
    preempted: list[str],
    admitted: list[str],
) -> None:
    got = schedule(running, waiting, lim)
    assert [(c.request_id, c.num_tokens, c.new_blocks) for c in got.chunks] == chunks
    assert list(got.preempted) == preempted
    assert list(got.admitted) == admitted


def test_a_victim_scheduled_earlier_in_the_step_is_unscheduled() -> None:
    # "new" is a decode (runs first), "old" a prefill continuation that needs a block later.
    running = [run("old", 4, 4, held=1), run("new", 1, 2, held=1)]
    got = schedule(running, [], limits(free=0))
    assert got.chunks == (ScheduledChunk("old", 4, 1),)
    assert got.preempted == ("new",)
    assert got.num_tokens == 4 and got.free_blocks_left == 0


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[RunningSeq], list[WaitingSeq], StepLimits]:
    running = []
    for i in range(draw(st.integers(0, 6))):
        n = draw(st.integers(1, 20))
        ctx = draw(st.integers(0, 40))
        held = draw(st.integers(0, blocks_for(ctx + n, BS)))
        held = max(held, blocks_for(ctx, BS))
        running.append(RunningSeq(f"r{i}", n, ctx, held, draw(st.integers(0, held))))
    waiting = [
        wait(f"w{i}", n, cached=min(draw(st.integers(0, 3)) * BS, n - 1))
        for i, n in enumerate(draw(st.lists(st.integers(1, 50), max_size=5)))
    ]
    lim = limits(
        budget=draw(st.integers(1, 64)), seqs=draw(st.integers(1, 8)), free=draw(st.integers(0, 30))
    )
    return running, waiting, lim


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_every_decision_respects_budget_blocks_and_order(
    case: tuple[list[RunningSeq], list[WaitingSeq], StepLimits],
) -> None:
    running, waiting, lim = case
    got = schedule(running, waiting, lim)
    ids = [c.request_id for c in got.chunks]
    assert len(ids) == len(set(ids))
    assert got.num_tokens <= lim.token_budget
    assert not set(ids) & set(got.preempted)
    # victims come off the newest end of the running list, in order
    order = [r.request_id for r in running]
    assert list(got.preempted) == order[len(order) - len(got.preempted) :][::-1]
    # admission is a FIFO prefix of the waiting queue, and never in a step that preempted
    assert list(got.admitted) == [w.request_id for w in waiting[: len(got.admitted)]]
    assert not (got.admitted and got.preempted)
    assert len(running) - len(got.preempted) + len(got.admitted) <= max(
        lim.max_num_seqs, len(running)
    )
    # blocks: what was handed out never exceeds what was free plus what victims returned
    by_run = {r.request_id: r for r in running}
    by_wait = {w.request_id: w for w in waiting}
    freed = sum(by_run[v].freeable_blocks for v in got.preempted)
    used = sum(c.new_blocks for c in got.chunks) + sum(
        by_wait[a].admit_blocks for a in got.admitted
    )
    assert used <= lim.free_blocks + freed
    assert got.free_blocks_left == lim.free_blocks + freed - used
    for c in got.chunks:
        if c.request_id in by_run:
            r = by_run[c.request_id]
            assert 1 <= c.num_tokens <= r.num_new_tokens
            assert r.blocks_held + c.new_blocks >= blocks_for(r.context_len + c.num_tokens, BS)
        else:
            w = by_wait[c.request_id]
            assert 1 <= c.num_tokens <= w.num_tokens - w.num_cached


# --- DP ranks: each replica has its own capacity (StepLimits.replica_free) --------------------


def on(replica: int, seq: RunningSeq) -> RunningSeq:
    return replace(seq, replica=replica)


def replica_limits(*free: int) -> StepLimits:
    return replace(limits(), replica_free=free)


REPLICA_CASES = [
    pytest.param(
        [],
        [wait("a", 8), wait("b", 4), wait("c", 4)],
        replica_limits(3, 3),
        [],
        ["a", "b", "c"],
        [0, 1, 1],  # the most free blocks, the lowest on a tie
        id="placed-on-the-replica-with-the-most-free-blocks",
    ),
    pytest.param(
        [],
        [wait("a", 40, cached=32, blocks=2), wait("b", 4)],
        replica_limits(10, 1),
        [],
        ["a", "b"],
        [0, 1],  # the pool gives a 2 blocks, its replica holds all 10 of its table
        id="a-replica-holds-the-whole-table-its-cached-prefix-too",
    ),
    pytest.param(
        [],
        [wait("a", 40), wait("b", 4)],
        replica_limits(9, 9),
        [],
        [],
        [],
        id="fits-the-pool-but-no-replica-so-fifo-waits",
    ),
    pytest.param(
        [
            on(0, run("old0", 1, 8, held=2)),
            on(0, run("mid0", 1, 4, held=1)),
            on(1, run("new1", 1, 4, held=1)),
        ],
        [wait("w", 4)],
        replica_limits(0, 5),
        ["mid0"],  # not new1, the newest overall: replica 0 is what is short
        [],
        [],
        id="a-short-replica-preempts-its-own-newest",
    ),
]


@pytest.mark.parametrize(
    ("running", "waiting", "lim", "preempted", "admitted", "replicas"), REPLICA_CASES
)
def test_replica_table(
    running: list[RunningSeq],
    waiting: list[WaitingSeq],
    lim: StepLimits,
    preempted: list[str],
    admitted: list[str],
    replicas: list[int],
) -> None:
    got = schedule(running, waiting, lim)
    assert list(got.preempted) == preempted
    assert list(got.admitted) == admitted
    assert list(got.replicas) == replicas
    ran = {c.request_id for c in got.chunks}
    assert ran == {r.request_id for r in running} - set(preempted) | set(admitted)


@st.composite
def replica_scenarios(draw: st.DrawFn) -> tuple[list[RunningSeq], list[WaitingSeq], StepLimits]:
    running, waiting, lim = draw(scenarios())
    n = draw(st.integers(1, 3))
    running = [replace(r, replica=draw(st.integers(0, n - 1))) for r in running]
    free = tuple(draw(st.integers(0, 15)) for _ in range(n))
    return running, waiting, replace(lim, replica_free=free)


@settings(max_examples=300, deadline=None)
@given(replica_scenarios())
def test_no_replica_is_overdrawn(
    case: tuple[list[RunningSeq], list[WaitingSeq], StepLimits],
) -> None:
    """What each replica gains (running growth, admitted whole tables) never exceeds what it
    had free plus what its preempted requests gave back; the pool's own rules still hold."""
    running, waiting, lim = case
    got = schedule(running, waiting, lim)
    by_run = {r.request_id: r for r in running}
    by_wait = {w.request_id: w for w in waiting}
    assert len(got.replicas) == len(got.admitted)
    assert list(got.admitted) == [w.request_id for w in waiting[: len(got.admitted)]]
    placed = dict(zip(got.admitted, got.replicas, strict=True))
    for replica, free in enumerate(lim.replica_free):
        gained = sum(
            c.new_blocks for c in got.chunks if c.request_id in by_run
            and by_run[c.request_id].replica == replica
        ) + sum(
            blocks_for(by_wait[a].num_tokens, BS) for a, r in placed.items() if r == replica
        )  # fmt: skip
        returned = sum(by_run[v].blocks_held for v in got.preempted if by_run[v].replica == replica)
        assert gained <= free + returned
    freed = sum(by_run[v].freeable_blocks for v in got.preempted)
    used = sum(c.new_blocks for c in got.chunks) + sum(
        by_wait[a].admit_blocks for a in got.admitted
    )
    assert used <= lim.free_blocks + freed
