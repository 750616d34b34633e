"""Carrying out the fleet controller's actions on one machine: gRPC control calls to workers,
admin calls to the router, and starting and stopping processes.

Owns the meaning of each action locally and keeps each one idempotent; never chooses an action
(the fleet core does) and never blocks the loop on a long call (LoadWeights runs as a task; a
failed call is reported and retried by a later round, since the core re-asserts its actions).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from loom_operator.api.roles import RoleName
from loom_operator.control.client import ControlError
from loom_operator.control.probe import Observer
from loom_operator.control.router_admin import RouterAdminError
from loom_operator.fleet.actions import (
    Action,
    Freeze,
    LoadWeights,
    MigrateRequests,
    RestartWorker,
    Resume,
    RouteOff,
    RouteOn,
    SetCondition,
    StartWorker,
    StopWorker,
)
from loom_operator.fleet.observed import FleetObservation
from loom_operator.local.cards import FleetCards
from loom_operator.local.events import EventSink, FleetEvent
from loom_operator.local.routing import RouterLink, endpoint_spec
from loom_operator.local.workers import ProcessSet

logger = logging.getLogger(__name__)

FREEZE_WAIT_S = 0.01  # Pause(WAIT) returns at once: admission closes, the drain is observed
CALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Round:
    """What one round's actions are carried out against."""

    cards: FleetCards
    observed: FleetObservation
    now: float


class Executor:
    """Carries out actions in the order given; remembers the LoadWeights calls still running."""

    def __init__(
        self, processes: ProcessSet, observer: Observer, router: RouterLink, events: EventSink
    ) -> None:
        self._processes = processes
        self._observer = observer
        self._router = router
        self._events = events
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._told: dict[str, tuple[str, str]] = {}
        """Condition type -> the (status, reason) last printed: a line per change, not per
        message update (status.json always has the current message)."""
        self.wake = asyncio.Event()
        """Set when something finished between rounds (a LoadWeights call)."""

    @property
    def loading(self) -> frozenset[str]:
        """Workers with a LoadWeights call in flight."""
        return frozenset(self._loads)

    async def execute(self, actions: tuple[Action, ...], r: Round) -> None:
        for action in actions:
            try:
                await self._do(action, r)
            except (ControlError, RouterAdminError) as exc:
                worker = getattr(action, "worker", "")
                msg = f"{type(action).__name__} {worker}: {exc} (retried next round)"
                self._events(FleetEvent("error", msg, worker, "warning"))

    async def _do(self, a: Action, r: Round) -> None:
        if isinstance(a, SetCondition):
            if self._told.get(a.type) != (a.status, a.reason):
                self._told[a.type] = (a.status, a.reason)
                msg = f"{a.type} {a.status} ({a.reason}): {a.message}"
                self._events(FleetEvent("condition", msg))
        elif isinstance(a, RouteOff):
            await self._router.down(a.worker)
        elif isinstance(a, Freeze):
            await self._freeze(a.worker)
        elif isinstance(a, MigrateRequests):
            await self._migrate(a)
        elif isinstance(a, StopWorker):
            await self._router.remove(a.worker)
            self._processes.stop_worker(a.worker)
            self._observer.forget(a.worker)
            self._events(FleetEvent("stopping", f"stopping {a.worker}: {a.reason}", a.worker))
        elif isinstance(a, RestartWorker):
            self._start(a.worker, a.role, a.source, a.version, r)
            msg = (
                f"restarted {a.worker} on {a.version} (attempt {a.attempt}, after "
                f"{a.backoff_s:g}s): {a.reason}"
            )
            self._events(FleetEvent("restarted", msg, a.worker, "warning"))
        elif isinstance(a, StartWorker):
            if not self._processes.alive(a.worker):
                self._start(a.worker, a.role, a.source, a.version, r)
                self._events(FleetEvent("started", f"starting {a.worker} on {a.version}", a.worker))
        elif isinstance(a, LoadWeights):
            self._load(a, r)
        elif isinstance(a, Resume):
            await self._resume(a.worker)
        elif isinstance(a, RouteOn):
            await self._route_on(a.worker, r)

    def _start(self, name: str, role: RoleName, source: str, version: str, r: Round) -> None:
        workers = len(r.cards.desired.slots)
        self._processes.start_worker(r.cards, name, role, source, version, r.now, workers)
        self._observer.forget(name)

    async def _freeze(self, name: str) -> None:
        """Router: drain. Runtime: close admission once the router has nothing in flight to it
        (read in a later round), so no request already on its way is refused; until then the
        core re-sends Freeze each round. Without a router answering, close it at once."""
        try:
            if await self._router.drain(name) or not self._router.quiet(name):
                return
        except RouterAdminError as exc:
            logger.warning("freeze %s without the router: %s", name, exc)
        entry = self._processes.table.get(name)
        if entry is not None and self._processes.alive(name):
            await self._observer.control(entry).pause("wait", FREEZE_WAIT_S, CALL_TIMEOUT_S)

    async def _migrate(self, a: MigrateRequests) -> None:
        await self._router.migrate(a.worker)
        entry = self._processes.table.get(a.worker)
        if a.abort and entry is not None and self._processes.alive(a.worker):
            await self._observer.control(entry).pause("abort", 0.0, CALL_TIMEOUT_S)
        self._events(
            FleetEvent("migrate", f"migrating {a.worker}'s requests: {a.reason}", a.worker)
        )

    def _load(self, a: LoadWeights, r: Round) -> None:
        if a.worker in self._loads:
            return
        entry = self._processes.table.get(a.worker)
        if entry is None:
            return
        timeout = r.cards.desired.sync.load_timeout_s
        client = self._observer.control(entry)

        async def load() -> None:
            try:
                status = await client.load_weights(a.source, a.version, timeout, a.kv)
                self._processes.record_version(a.worker, a.version)
                if a.kv:  # swapped while serving: the router pairs it with its new version now
                    spec = endpoint_spec(entry, status.weights_version)
                    await self._router.route_on(a.worker, spec)
                msg = f"{a.worker} loaded {a.version} ({status.state})"
                self._events(FleetEvent("weights", msg, a.worker))
            except ControlError as exc:
                self._events(
                    FleetEvent("error", f"LoadWeights {a.worker}: {exc}", a.worker, "error")
                )
            finally:
                self._loads.pop(a.worker, None)
                self.wake.set()

        self._events(FleetEvent("weights", f"{a.worker}: loading {a.version}", a.worker))
        self._loads[a.worker] = asyncio.create_task(load(), name=f"load-{a.worker}")

    async def _resume(self, name: str) -> None:
        entry = self._processes.table.get(name)
        if entry is None:
            return
        status = await self._observer.control(entry).resume(CALL_TIMEOUT_S)
        await self._router.route_on(name, endpoint_spec(entry, status.weights_version))

    async def _route_on(self, name: str, r: Round) -> None:
        entry = self._processes.table.get(name)
        w = r.observed.get(name)
        if entry is None or w is None or w.weights_version is None:
            return
        await self._router.route_on(name, endpoint_spec(entry, w.weights_version))

    async def wait_loads(self) -> None:
        """Wait out LoadWeights calls in flight (at shutdown), bounded by their own deadlines."""
        for task in list(self._loads.values()):
            await task
