"""Which cards run a loop on a replica: every card the watch holds but those being deleted, and
with shards only those of the shards it holds; the supervisor starts a loop when a card appears
or its shard is taken, stops it when the card goes or the shard is given back, and lets a loop
that failed rest before it starts again."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from loom_operator.k8s.card_supervisor import (
    CardRef,
    CardSupervisor,
    cards_to_run,
    plan_cards,
)
from loom_operator.k8s.shard_keeper import Shards
from loom_operator.k8s.shards import shard_of

SHARDS = 4


def uid_in(shard: int, n: int = 0) -> str:
    """The n-th UID (of a fixed sequence) whose card is in `shard`."""
    found = [u for u in (f"uid-{i}" for i in range(200)) if shard_of(u, SHARDS) == shard]
    return found[n]


A = CardRef("ns", "a", uid_in(0))
B = CardRef("ns", "b", uid_in(1))
C = CardRef("other", "c", uid_in(0, 1))
A_AGAIN = CardRef("ns", "a", uid_in(2))
"""A new card under a's name."""


@pytest.mark.parametrize(
    ("known", "shards", "held", "runs"),
    [
        ({A: False, B: False}, None, set(), {A, B}),  # not sharded: every card
        ({A: False, B: True}, None, set(), {A}),  # B is being deleted
        ({A: False, B: False, C: False}, SHARDS, {0}, {A, C}),  # only shard 0's cards
        ({A: False, B: False, C: False}, SHARDS, {1, 3}, {B}),
        ({A: False, B: False}, SHARDS, set(), set()),  # no shard held (or its Lease lapsed)
        ({A: True, C: False}, SHARDS, {0}, {C}),
        ({}, SHARDS, {0, 1, 2, 3}, set()),
    ],
)
def test_the_cards_that_run_here(
    known: dict[CardRef, bool], shards: int | None, held: set[int], runs: set[CardRef]
) -> None:
    assert cards_to_run(known, shards, held) == runs


@pytest.mark.parametrize(
    ("wanted", "running", "resting", "start", "stop"),
    [
        ({A, B}, set(), set(), (A, B), ()),
        ({A}, {A, B}, set(), (), (B,)),
        ({A_AGAIN}, {A}, set(), (A_AGAIN,), (A,)),  # a reused name is another card
        ({A, B}, {A}, {B}, (), ()),  # B's loop failed a moment ago: it rests
        (set(), {A}, {A}, (), (A,)),
    ],
)
def test_a_sweeps_plan(
    wanted: set[CardRef],
    running: set[CardRef],
    resting: set[CardRef],
    start: tuple[CardRef, ...],
    stop: tuple[CardRef, ...],
) -> None:
    plan = plan_cards(wanted, running, resting)
    assert (plan.start, plan.stop) == (start, stop)


def card(ref: CardRef, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    return {"metadata": meta}


class Loops:
    """Fake card loops: each runs until stopped, or fails at once when told to."""

    def __init__(self) -> None:
        self.started: list[CardRef] = []
        self.stopped: list[CardRef] = []
        self.failing: set[CardRef] = set()

    async def run(self, ref: CardRef, stop: asyncio.Event) -> None:
        self.started.append(ref)
        if ref in self.failing:
            raise RuntimeError("broken")
        await stop.wait()
        self.stopped.append(ref)


def test_loops_follow_the_cards_and_the_shards_held() -> None:
    async def run() -> None:
        cards = [card(A), card(B), card(C)]
        shards, loops = Shards(SHARDS), Loops()
        shards.set_acting(frozenset({0}), 60.0)
        supervisor = CardSupervisor(lambda: cards, shards, loops.run)
        await supervisor.sweep()
        assert supervisor.running == set(), "no loop before kopf's indexes are filled"
        supervisor.indexed()
        await supervisor.sweep()
        await asyncio.sleep(0)
        assert supervisor.running == {A, C} and sorted(loops.started) == [A, C]
        shards.set_acting(frozenset({1}), 60.0)  # shard 0 given back, shard 1 taken
        await supervisor.sweep()
        assert supervisor.running == {B} and sorted(loops.stopped) == [A, C]
        cards[1] = card(B, deleting=True)
        await supervisor.sweep()
        assert supervisor.running == set() and B in loops.stopped
        await supervisor.close()

    asyncio.run(run())


def test_a_lapsed_shard_keeps_its_loops_until_it_is_lost() -> None:
    """A renewal late on a slow API server stops the acting, not the loops (they would start
    over: apply every object again, forget the status they wrote)."""

    async def run() -> None:
        cards = [card(A), card(B), card(C)]
        shards, loops = Shards(SHARDS), Loops()
        shards.set_acting(frozenset({0}), 0.05)
        supervisor = CardSupervisor(lambda: cards, shards, loops.run)
        supervisor.indexed()
        await supervisor.sweep()
        await asyncio.sleep(0.1)  # the Leases lapse: nothing acts on shard 0 now
        assert shards.acting_on == frozenset()
        await supervisor.sweep()
        assert supervisor.running == {A, C} and loops.stopped == []
        shards.set_acting(frozenset({1}), 60.0)  # the keeper's next look: shard 0 was lost
        await supervisor.sweep()
        assert supervisor.running == {B} and sorted(loops.stopped) == [A, C]
        await supervisor.close()

    asyncio.run(run())


def test_an_unsharded_supervisor_runs_every_card_and_stops_them_on_close() -> None:
    async def run() -> None:
        cards, loops = [card(A), card(B)], Loops()
        supervisor = CardSupervisor(lambda: cards, Shards(), loops.run)
        supervisor.indexed()
        await supervisor.sweep()
        cards.pop()  # B deleted
        await supervisor.sweep()
        assert supervisor.running == {A} and loops.stopped == [B]
        await supervisor.close()
        assert supervisor.running == set() and loops.stopped == [B, A]

    asyncio.run(run())


def test_a_failed_loop_rests_before_it_starts_again() -> None:
    async def run() -> None:
        loops = Loops()
        loops.failing.add(A)
        supervisor = CardSupervisor(lambda: [card(A)], Shards(), loops.run)
        supervisor.indexed()
        await supervisor.sweep()
        await asyncio.sleep(0)
        await supervisor.sweep()  # reaped, resting
        await supervisor.sweep()
        assert loops.started == [A] and supervisor.running == set()
        await supervisor.close()

    asyncio.run(run())


def test_the_supervisor_sweeps_when_poked() -> None:
    async def run() -> None:
        cards: list[dict[str, Any]] = []
        loops = Loops()
        supervisor = CardSupervisor(lambda: cards, Shards(), loops.run)
        supervisor.start()
        cards.append(card(A))
        supervisor.indexed()  # a card event: sweep now, not at the next SWEEP_S
        for _ in range(100):
            await asyncio.sleep(0.01)
            if loops.started:
                break
        assert loops.started == [A]
        await supervisor.close()
        assert loops.stopped == [A]

    asyncio.run(run())


HANDLER = contextvars.ContextVar[str]("handler", default="startup")


def test_loops_run_in_the_context_of_the_kopf_handler_that_said_the_indexes_are_filled() -> None:
    """kopf keeps its Event posting in context variables its startup handlers lack."""
    seen: list[str] = []

    async def loop(ref: CardRef, stop: asyncio.Event) -> None:
        seen.append(HANDLER.get())
        await stop.wait()

    async def run() -> None:
        supervisor = CardSupervisor(lambda: [card(A)], Shards(), loop)

        async def handler() -> None:
            HANDLER.set("card event")
            supervisor.indexed()

        await asyncio.create_task(handler())
        await supervisor.sweep()
        await asyncio.sleep(0)
        assert seen == ["card event"]
        await supervisor.close()

    asyncio.run(run())
