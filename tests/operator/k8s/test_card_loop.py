"""A card's loop: it looks when woken, applies the card again once REAPPLY_INTERVAL_S has passed
since its last apply (drift correction, no kopf timer), acts on nothing while the card's shard
is not held, and takes its entries along when it stops."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf
import pytest

from loom_operator.k8s import card_loop
from loom_operator.k8s.card_loop import CARDS_INDEX, CardLoop, run_card
from loom_operator.k8s.card_supervisor import CardRef
from loom_operator.k8s.drift import REAPPLY_INTERVAL_S, Applied, reapply_due
from loom_operator.k8s.shard_keeper import Shards
from loom_operator.k8s.wakers import CardWakers

REF = CardRef("ns", "c", "uid-c")
CARD = {"apiVersion": "loom.dev/v1alpha1", "kind": "DeploymentCard",
        "metadata": {"namespace": "ns", "name": "c", "uid": "uid-c", "generation": 1},
        "spec": {"modelCard": "m"}}  # fmt: skip


@pytest.mark.parametrize(
    ("applied_at", "now", "due"),
    [(100.0, 100.0, False), (100.0, 100.0 + REAPPLY_INTERVAL_S - 0.1, False),
     (100.0, 100.0 + REAPPLY_INTERVAL_S, True), (100.0, 500.0, True)],
)  # fmt: skip
def test_a_card_is_applied_again_every_interval(applied_at: float, now: float, due: bool) -> None:
    assert reapply_due(applied_at, now) is due


class Part:
    """The fleet or scaler of a fake loop: only closed."""

    namespace, name = REF.namespace, REF.name
    closed = False

    async def close(self) -> None:
        self.closed = True


class Calls:
    """What the loop did, with the card's real work replaced."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, applied_ago_s: float) -> None:
        self.reconciles: list[bool] = []
        self.looks = 0
        self.loop: CardLoop | None = None

        def take(body: kopf.Body, memo: kopf.Memo, wake: asyncio.Event) -> CardLoop:
            self.loop = CardLoop(Part(), Part(), Part())  # type: ignore[arg-type]
            self.loop.applied_at = time.monotonic() - applied_ago_s
            return self.loop

        async def look(*_: Any) -> None:
            self.looks += 1

        def reconcile(card: Any, memo: Any, cache: Any, again: bool = False) -> None:
            self.reconciles.append(again)

        monkeypatch.setattr(card_loop, "_take", take)
        monkeypatch.setattr(card_loop, "_look", look)
        monkeypatch.setattr(card_loop, "reconcile", reconcile)
        monkeypatch.setattr(card_loop, "write_status", lambda *_: None)


async def until(check: Any, what: str) -> None:
    for _ in range(300):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_loop_reapplies_once_the_interval_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls(monkeypatch, applied_ago_s=REAPPLY_INTERVAL_S - 0.3)

    async def run() -> None:
        memo = kopf.Memo(applied=Applied(), wakers=CardWakers(), kube=None)
        memo.applied.card_applied("ns", "uid-c", (1, ""))
        stop = asyncio.Event()
        task = asyncio.create_task(run_card(REF, memo, {CARDS_INDEX: {("ns", "c"): [CARD]}}, stop))
        await until(lambda: calls.looks == 1, "the first look")
        assert calls.reconciles == []  # applied 29.7 s ago: not yet
        await asyncio.sleep(0.4)
        memo.wakers.wake(("ns", "c"))
        await until(lambda: calls.looks == 2, "the second look")
        assert calls.reconciles == [True]  # the drift correction, in the loop
        memo.wakers.wake(("ns", "c"))
        await until(lambda: calls.looks == 3, "the third look")
        assert calls.reconciles == [True]  # next one REAPPLY_INTERVAL_S after this one
        stop.set()
        await asyncio.wait_for(task, 5)
        assert calls.loop is not None and calls.loop.fleet.closed  # type: ignore[attr-defined]
        assert memo.applied.card_at("ns", "uid-c") is None  # forgotten
        assert memo.wakers.pending() == 0

    asyncio.run(run())


def test_the_loop_acts_on_nothing_while_the_shard_is_not_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = Calls(monkeypatch, applied_ago_s=REAPPLY_INTERVAL_S * 2)

    async def run() -> None:
        memo = kopf.Memo(applied=Applied(), wakers=CardWakers(), kube=None, shards=Shards(12))
        stop = asyncio.Event()
        task = asyncio.create_task(run_card(REF, memo, {CARDS_INDEX: {("ns", "c"): [CARD]}}, stop))
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(task, 5)
        assert calls.loop is None and calls.looks == 0 and calls.reconciles == []

    asyncio.run(run())


def test_a_card_whose_name_now_names_another_card_is_not_looked_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = Calls(monkeypatch, applied_ago_s=0.0)

    async def run() -> None:
        memo = kopf.Memo(applied=Applied(), wakers=CardWakers(), kube=None)
        other = {**CARD, "metadata": {**CARD["metadata"], "uid": "uid-new"}}  # type: ignore[dict-item]
        stop = asyncio.Event()
        task = asyncio.create_task(run_card(REF, memo, {CARDS_INDEX: {("ns", "c"): [other]}}, stop))
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(task, 5)
        assert calls.loop is None and calls.looks == 0

    asyncio.run(run())
