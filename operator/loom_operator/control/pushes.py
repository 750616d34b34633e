"""A trainer's weight pushes into one fleet, on either substrate: open one (the pure rules in
fleet/push.py), ask every worker to join it (ReceiveWeights), and follow it until the fleet's
weight sync has swapped it in.

Owns one fleet's latest push and the ReceiveWeights calls in flight; never swaps weights itself
(the fleet's weight sync does, with source push://<update_id>), never blocks a round, and never
knows how workers are reached or where the push is persisted (the substrate passes both in:
`loom up`'s process table and state file, the operator's pods and the card's status).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import cast

from loom_operator.api.status import PushMode
from loom_operator.control.client import ControlClient, ControlError
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.push import (
    PushConflict,
    PushUpdate,
    pushed_desired,
    refuse_push,
    swap_done,
)
from loom_operator.fleet.record import SyncRecord

DEADLINE_MARGIN_S = 30.0  # a ReceiveWeights call may run this much past the push's timeout

Clients = Callable[[str], ControlClient | None]
"""Worker name -> its control client (None: no such worker, or not reachable now)."""
Say = Callable[[str, bool], None]
"""(message, warning): tell the person running the fleet (loom up's events, Kubernetes Events)."""
Persist = Callable[[PushUpdate], None]
"""Keep the push every worker staged, so a restarted controller serves it, not the card's."""


class PushCoordinator:
    """One fleet's pushes: the latest one, and its ReceiveWeights calls in flight."""

    def __init__(
        self,
        clients: Clients,
        say: Say,
        wake: Callable[[], None],
        persist: Persist,
        serving: PushUpdate | None = None,
    ) -> None:
        self._clients = clients
        self._say = say
        self._wake = wake
        self._persist = persist
        self.serving: PushUpdate | None = serving
        """The latest push every worker staged: what the fleet serves unless the card moved."""
        swapping = serving is not None and serving.state == "swapping"
        self.update: PushUpdate | None = serving if swapping else None
        """The push opened last (a restarted controller follows the swap it left to its end)."""
        self._calls: dict[str, asyncio.Task[None]] = {}
        self._failures: list[str] = []

    def open(
        self,
        version: str,
        mode: str,
        timeout_s: float,
        store: tuple[str, int],
        desired: DesiredFleet,
        observed: FleetObservation,
        sync: SyncRecord | None,
        kv: str = "",
    ) -> PushUpdate:
        """Open a push whose group meets at the trainer's TCPStore `store` and ask every worker
        to join it; PushConflict says why it may not open."""
        card_version = desired.weights_version
        desired = self.desired(desired)
        why = refuse_push(desired, observed, sync, self.update, version, mode, kv)
        if why is not None:
            raise PushConflict(why)
        if self._calls:
            busy = ", ".join(sorted(self._calls))
            raise PushConflict(f"the last push's transfer has not ended on {busy}; retry shortly")
        workers = tuple(s.name for s in desired.slots)
        m = cast(PushMode, mode)  # refuse_push checked it
        update = PushUpdate(
            secrets.token_hex(6), version, m, workers, store[0], store[1], timeout_s,
            card_version, kv=kv,
        )  # fmt: skip
        self.update = update
        self._failures = []
        for rank, name in enumerate(workers, start=1):
            self._calls[name] = asyncio.create_task(self._receive(update, name, rank))
        self._say(f"push {update.update_id}: {version} ({mode}) opened", False)
        return update

    async def _receive(self, update: PushUpdate, name: str, rank: int) -> None:
        try:
            client = self._clients(name)
            if client is None:
                raise ControlError(name, "ReceiveWeights", "NOT_FOUND", "no such worker")
            await client.receive_weights(
                update.update_id, (update.store_host, update.store_port), rank,
                len(update.workers) + 1, update.version, update.timeout_s,
                update.timeout_s * 4 + DEADLINE_MARGIN_S,
            )  # fmt: skip
            if self.update is not None and self.update.update_id == update.update_id:
                self.update = replace(self.update, staged=self.update.staged | {name})
        except ControlError as exc:
            self._failures.append(f"{name}: {exc.details or exc.code}")
        finally:
            self._calls.pop(name, None)
            if not self._calls:
                self._transfer_ended(update.update_id)
            self._wake()

    def _transfer_ended(self, update_id: str) -> None:
        u = self.update
        if u is None or u.update_id != update_id:
            return
        if self._failures or u.staged != frozenset(u.workers):
            error = "; ".join(self._failures) or "not every worker staged the push"
            self.update = replace(u, state="failed", error=error)
            self._say(f"push {u.update_id} of {u.version} failed, nothing changed: {error}", True)
            return
        self.update = replace(u, state="swapping")
        self._serve(self.update)
        self._say(f"push {u.update_id}: every worker staged {u.version}", False)

    def _serve(self, update: PushUpdate) -> None:
        self.serving = update
        self._persist(update)

    def desired(self, card: DesiredFleet) -> DesiredFleet:
        """What the fleet serves: the card's version, or the latest push staged everywhere."""
        return pushed_desired(card, self.serving)

    def follow(
        self, card: DesiredFleet, observed: FleetObservation, sync: SyncRecord | None
    ) -> None:
        """After a round: a swapping push is done once every worker serves it."""
        u = self.update
        if u is None or u.state != "swapping":
            return
        desired = self.desired(card)
        if desired.weights_version != u.version:
            self.update = replace(u, state="failed", error="the card's weightsVersion changed")
        elif swap_done(desired, observed, sync):
            self.update = replace(u, state="done")
            self._serve(self.update)
            self._say(f"push {u.update_id}: every worker serves {u.version}", False)

    @property
    def latest(self) -> PushUpdate | None:
        """The push a trainer asks about: the one opened here, else the one the fleet serves."""
        return self.update or self.serving

    async def close(self) -> None:
        for task in list(self._calls.values()):
            task.cancel()
