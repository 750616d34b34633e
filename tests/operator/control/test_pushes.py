"""The push coordinator over fake workers: every worker joins the push at its rank and stages
it, then the fleet is asked to serve it (and it is persisted); one worker failing fails the
whole push with nothing changed; the swap is done once every worker serves it; a restarted
controller follows a swap it left."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from tests.operator.fleet.conftest import make_fleet, make_worker

from loom_operator.control.client import ControlError
from loom_operator.control.pushes import PushCoordinator
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.push import PushConflict, PushUpdate

STORE = ("10.1.2.3", 29500)


class FakeWorker:
    """A worker's control client that records its ReceiveWeights call."""

    def __init__(self, name: str, fails: bool = False) -> None:
        self.name, self.fails = name, fails
        self.calls: list[tuple[str, tuple[str, int], int, int, str]] = []

    async def receive_weights(
        self, update_id: str, store: tuple[str, int], rank: int, world: int, version: str,
        timeout_s: float, deadline_s: float,
    ) -> None:  # fmt: skip
        self.calls.append((update_id, store, rank, world, version))
        await asyncio.sleep(0)
        if self.fails:
            raise ControlError(self.name, "ReceiveWeights", "FAILED_PRECONDITION", "no space")


def observed(version: str = "v2") -> FleetObservation:
    return FleetObservation(
        (make_worker("prefill", 0, version), make_worker("decode", 0, version)), now=10.0
    )


def coordinator(
    workers: dict[str, FakeWorker], serving: PushUpdate | None = None
) -> tuple[PushCoordinator, list[str], list[PushUpdate]]:
    said: list[str] = []
    kept: list[PushUpdate] = []
    c = PushCoordinator(
        workers.get,  # type: ignore[arg-type]
        lambda message, warning: said.append(("warning: " if warning else "") + message),
        lambda: None, kept.append, serving,
    )  # fmt: skip
    return c, said, kept


async def opened(c: PushCoordinator) -> PushUpdate:
    u = c.open("v3", "barrier", 5.0, STORE, make_fleet(), observed(), None)
    while c.update is not None and c.update.state == "receiving":
        await asyncio.sleep(0)
    return u


def test_every_worker_joins_at_its_rank_then_the_fleet_serves_the_push() -> None:
    workers = {n: FakeWorker(n) for n in ("dep-prefill-0", "dep-decode-0")}
    c, said, kept = coordinator(workers)
    u = asyncio.run(opened(c))
    assert u.workers == ("dep-prefill-0", "dep-decode-0") and u.base_version == "v2"
    assert workers["dep-prefill-0"].calls == [(u.update_id, STORE, 1, 3, "v3")]
    assert workers["dep-decode-0"].calls == [(u.update_id, STORE, 2, 3, "v3")]
    assert c.update is not None and c.update.state == "swapping"
    assert kept == [c.update]  # persisted before any worker swaps
    served = c.desired(make_fleet())
    assert served.weights_version == "v3" and served.source_uri == f"push://{u.update_id}"
    assert served.sync.strategy == "Barrier"
    c.follow(make_fleet(), observed("v2"), None)
    assert c.update.state == "swapping"
    c.follow(make_fleet(), observed("v3"), None)
    done = c.update
    assert done.state == "done" and kept[-1].state == "done" and c.latest == done
    assert said[-1] == f"push {u.update_id}: every worker serves v3"


def test_one_worker_failing_fails_the_push_and_nothing_changes() -> None:
    workers = {"dep-prefill-0": FakeWorker("dep-prefill-0"),
               "dep-decode-0": FakeWorker("dep-decode-0", fails=True)}  # fmt: skip
    c, said, kept = coordinator(workers)
    asyncio.run(opened(c))
    assert c.update is not None and c.update.state == "failed"
    assert c.update.error == "dep-decode-0: no space"
    assert kept == [] and c.desired(make_fleet()).weights_version == "v2"
    assert said[-1].startswith("warning: push") and "nothing changed" in said[-1]


def test_a_worker_that_cannot_be_reached_fails_the_push() -> None:
    c, _, kept = coordinator({"dep-prefill-0": FakeWorker("dep-prefill-0")})
    asyncio.run(opened(c))
    assert c.update is not None and c.update.state == "failed"
    assert "dep-decode-0: no such worker" in c.update.error and kept == []


def test_a_second_push_is_refused_while_one_is_open() -> None:
    workers = {n: FakeWorker(n) for n in ("dep-prefill-0", "dep-decode-0")}
    c, _, _ = coordinator(workers)

    async def run() -> None:
        c.open("v3", "barrier", 5.0, STORE, make_fleet(), observed(), None)
        with pytest.raises(PushConflict, match="one trainer pushes at a time"):
            c.open("v4", "barrier", 5.0, STORE, make_fleet(), observed(), None)
        await c.close()

    asyncio.run(run())


def test_a_restarted_controller_follows_the_swap_it_left_and_a_card_edit_wins() -> None:
    left = PushUpdate("u1", "v3", "rolling", ("dep-prefill-0", "dep-decode-0"), *STORE, 5.0,
                      "v2", state="swapping")  # fmt: skip
    c, _, kept = coordinator({}, left)
    assert c.update == left and c.desired(make_fleet()).weights_version == "v3"
    c.follow(make_fleet(), observed("v3"), None)
    assert c.update is not None and c.update.state == "done" and kept[-1].state == "done"
    edited = make_fleet(version="v9")
    assert c.desired(edited) == edited
    c2, _, _ = coordinator({}, replace(left, state="done"))
    assert c2.update is None and c2.latest is not None and c2.latest.state == "done"
