"""A trainer's weight pushes on one machine: open one (the pure rules in fleet/push.py), ask
every worker to join it (ReceiveWeights), and follow it until the sync has swapped it in.

Owns the one push of the local fleet and the calls to workers it needs; never swaps weights
itself (the fleet's weight sync does, with source push://<update_id>) and never blocks a round.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import cast

from loom_operator.control.client import ControlError
from loom_operator.control.probe import Observer
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.push import (
    PushConflict,
    PushMode,
    PushUpdate,
    pushed_desired,
    refuse_push,
    swap_done,
)
from loom_operator.fleet.record import SyncRecord
from loom_operator.local.events import EventSink, FleetEvent
from loom_operator.local.ports import free_ports
from loom_operator.local.state import write_atomic
from loom_operator.local.workers import ProcessSet

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEADLINE_MARGIN_S = 30.0  # a ReceiveWeights call may run this much past the push's timeout


class PushCoordinator:
    """The local fleet's pushes: the latest one, and its ReceiveWeights calls in flight."""

    def __init__(
        self,
        processes: ProcessSet,
        observer: Observer,
        events: EventSink,
        wake: Callable[[], None],
        path: Path,
    ) -> None:
        self._processes = processes
        self._path = path
        self._wake = wake
        self._observer = observer
        self._events = events
        self.update: PushUpdate | None = None
        self._serving: PushUpdate | None = load_serving(path)
        """The latest push every worker staged: what the fleet serves unless the card moved
        (persisted, so that a restarted controller does not sync the fleet back to the card)."""
        self._calls: dict[str, asyncio.Task[None]] = {}
        self._failures: list[str] = []

    def open(
        self,
        version: str,
        mode: str,
        timeout_s: float,
        desired: DesiredFleet,
        observed: FleetObservation,
        sync: SyncRecord | None,
        kv: str = "",
    ) -> PushUpdate:
        """Open a push and ask every worker to join it; PushConflict says why it may not."""
        card_version = desired.weights_version
        desired = self.desired(desired)
        why = refuse_push(desired, observed, sync, self.update, version, mode, kv)
        if why is not None:
            raise PushConflict(why)
        if self._calls:
            busy = ", ".join(sorted(self._calls))
            raise PushConflict(f"the last push's transfer has not ended on {busy}; retry shortly")
        workers = tuple(s.name for s in desired.slots)
        port = free_ports(1, self._processes.table.ports())[0]
        m = cast(PushMode, mode)  # refuse_push checked it
        update = PushUpdate(
            secrets.token_hex(6), version, m, workers, HOST, port, timeout_s, card_version,
            kv=kv,
        )  # fmt: skip
        self.update = update
        self._failures = []
        for rank, name in enumerate(workers, start=1):
            self._calls[name] = asyncio.create_task(self._receive(update, name, rank))
        self._events(FleetEvent("push", f"push {update.update_id}: {version} ({mode}) opened"))
        return update

    async def _receive(self, update: PushUpdate, name: str, rank: int) -> None:
        entry = self._processes.table.get(name)
        try:
            if entry is None:
                raise ControlError(name, "ReceiveWeights", "NOT_FOUND", "no such worker")
            await self._observer.control(entry).receive_weights(
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
            msg = f"push {u.update_id} of {u.version} failed, nothing changed: {error}"
            self._events(FleetEvent("push", msg, level="warning"))
            return
        self.update = replace(u, state="swapping")
        self._serve(self.update)
        self._events(FleetEvent("push", f"push {u.update_id}: every worker staged {u.version}"))

    def _serve(self, update: PushUpdate) -> None:
        self._serving = update
        write_atomic(self._path, json.dumps(update.as_json()))

    def desired(self, card: DesiredFleet) -> DesiredFleet:
        """What the fleet serves: the card's version, or the latest push staged everywhere."""
        return pushed_desired(card, self._serving)

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
            self._events(FleetEvent("push", f"push {u.update_id}: every worker serves {u.version}"))

    async def close(self) -> None:
        for task in list(self._calls.values()):
            task.cancel()


def load_serving(path: Path) -> PushUpdate | None:
    """The push the fleet served when the controller last ran (None: none, or unreadable)."""
    try:
        return PushUpdate.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("%s: ignored (%s); the fleet serves the card's version", path, exc)
        return None
