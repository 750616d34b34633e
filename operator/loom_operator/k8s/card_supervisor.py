"""Which DeploymentCards this replica runs a loop for, and those loops' lives: one asyncio task
per card it may act on (card_loop.py), started when the card appears in kopf's index and its
shard is held, stopped when the card goes (or starts being deleted) or its shard is given back
or lost. A shard whose Lease lapsed a moment (its renewal late on a slow API server) keeps its
loops: they act on nothing until it is renewed (each look asks `Shards.acting`), and keep their
state (what they applied, the status they wrote) instead of starting over.

Owns the card tasks of one operator process; never acts on a card itself. Started by kopf's
startup handler (handlers.py), not as kopf daemons and timers: kopf spawns those for every card
on every replica (kopf's `when=` filters cannot help, it keeps the diff-base of filtered
changes), so at 1,000 cards and three replicas each kept 1,000 daemons and the drift timer fired
about 100 times a second, two thirds of it only to return. Here a replica keeps tasks for the
cards of its own shards only, and the decision is a pure function (`cards_to_run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any

import kopf

from loom_operator.k8s.shard_keeper import Shards
from loom_operator.k8s.shards import shard_of

logger = logging.getLogger(__name__)

SWEEP_S = 2.0
"""Longest time between two looks at the cards and shards."""
STOP_S = 10.0
"""How long a stopping card loop may take to finish its look before it is cancelled."""
RESTART_S = 60.0
"""How long a card whose loop failed waits before its loop starts again."""

Obj = Mapping[str, Any]


@dataclass(frozen=True, order=True)
class CardRef:
    """One DeploymentCard: a name reused by a new card is another card (its UID differs)."""

    namespace: str
    name: str
    uid: str


def card_ref(card: Obj) -> CardRef:
    meta = card["metadata"]
    return CardRef(str(meta["namespace"]), str(meta["name"]), str(meta["uid"]))


def cards_to_run(
    known: Mapping[CardRef, bool], shards: int | None, held: Set[int]
) -> frozenset[CardRef]:
    """The cards whose loop runs on this replica: every card the watch knows (`known`: each
    card -> whether it is being deleted) but those being deleted, and, when the cards are split
    into `shards` shards, only those whose shard is `held`. `shards` None: not sharded. Pure."""
    return frozenset(
        ref
        for ref, deleting in known.items()
        if not deleting and (shards is None or shard_of(ref.uid, shards) in held)
    )


@dataclass(frozen=True)
class CardPlan:
    """One sweep's steps: loops to start and loops to stop, each in card order."""

    start: tuple[CardRef, ...]
    stop: tuple[CardRef, ...]


def plan_cards(wanted: Set[CardRef], running: Set[CardRef], resting: Set[CardRef]) -> CardPlan:
    """Start what is wanted but neither running nor resting (its loop failed a moment ago); stop
    what runs but is no longer wanted. Pure."""
    return CardPlan(tuple(sorted(wanted - running - resting)), tuple(sorted(running - wanted)))


def shards_of(memo: kopf.Memo) -> Shards:
    """The cards this replica acts on (every card when the operator is not sharded)."""
    shards: Shards | None = getattr(memo, "shards", None)
    return shards if shards is not None else Shards()


RunCard = Callable[[CardRef, asyncio.Event], Coroutine[Any, Any, None]]
"""A card's loop: runs until its event is set."""


@dataclass(frozen=True)
class _Running:
    task: asyncio.Task[None]
    stop: asyncio.Event
    """Set to end the loop."""


class CardSupervisor:
    """The card loops of this replica; used from kopf's event loop only."""

    def __init__(self, cards: Callable[[], Iterable[Obj]], shards: Shards, run: RunCard) -> None:
        self._cards, self._shards, self._run = cards, shards, run
        self._running: dict[CardRef, _Running] = {}
        self._failed: dict[CardRef, float] = {}
        """Cards whose loop failed -> when (time.monotonic())."""
        self._poked = asyncio.Event()
        self._context: contextvars.Context | None = None
        """The context loops run in (None: kopf's indexes are not filled yet)."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name="card supervisor")

    def indexed(self) -> None:
        """kopf's watches have filled its indexes (its card handlers run only after): loops may
        start from now on, and a card appeared, went or changed. Called from a kopf resource
        handler: the loops run in a copy of its context, where kopf keeps its Event posting
        (a startup handler's context lacks it)."""
        if self._context is None:
            self._context = contextvars.copy_context()
        self._poked.set()

    def poke(self) -> None:
        """Sweep now (the shards held changed)."""
        self._poked.set()

    @property
    def running(self) -> frozenset[CardRef]:
        return frozenset(self._running)

    async def _supervise(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), SWEEP_S)
            self._poked.clear()
            try:
                await self.sweep()
            except Exception:  # a sweep that fails is tried again; the loops keep running
                logger.exception("card supervisor: sweep failed")

    async def sweep(self) -> None:
        """Reap the loops that ended, stop those no longer wanted, start the new ones."""
        self._reap()
        if self._context is None:
            return
        known = {card_ref(c): bool(c["metadata"].get("deletionTimestamp")) for c in self._cards()}
        wanted = cards_to_run(known, self._shards.shards, self._shards.assigned)
        now = time.monotonic()
        self._failed = {r: t for r, t in self._failed.items() if now - t < RESTART_S}
        plan = plan_cards(wanted, set(self._running), set(self._failed))
        await self._stop(plan.stop)
        for ref in plan.start:
            stop = asyncio.Event()
            name, context = f"card {ref.namespace}/{ref.name}", self._context.copy()
            task = asyncio.create_task(self._run(ref, stop), name=name, context=context)
            self._running[ref] = _Running(task, stop)
        if plan.start or plan.stop:
            logger.info("cards: started %d loops, stopped %d, running %d", len(plan.start),
                        len(plan.stop), len(self._running))  # fmt: skip

    def _reap(self) -> None:
        for ref, running in list(self._running.items()):
            if not running.task.done():
                continue
            del self._running[ref]
            exc = None if running.task.cancelled() else running.task.exception()
            if exc is not None:
                self._failed[ref] = time.monotonic()
                logger.error("%s/%s: card loop failed (again in %.0f s)", ref.namespace,
                             ref.name, RESTART_S, exc_info=exc)  # fmt: skip

    async def _stop(self, refs: Iterable[CardRef]) -> None:
        """Stop these loops: each finishes its look, or is cancelled after STOP_S."""
        stopping = [(ref, self._running.pop(ref)) for ref in refs if ref in self._running]
        if not stopping:
            return
        for _, running in stopping:
            running.stop.set()
        tasks = [running.task for _, running in stopping]
        _, late = await asyncio.wait(tasks, timeout=STOP_S)
        for task in late:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for (ref, _), result in zip(stopping, results, strict=True):
            if isinstance(result, Exception):
                logger.warning("%s/%s: card loop ended with %r", ref.namespace, ref.name, result)

    async def close(self) -> None:
        """Stop supervising and stop every loop (the operator stops)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stop(sorted(self._running))
