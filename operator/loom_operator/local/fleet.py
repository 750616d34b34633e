"""The local fleet controller loop: observe → reconcile → save the record → execute, on a
timer, with the card file watched for edits; plus starting up (adopting what an earlier
controller left running) and shutting down (drain, then stop everything).

Owns the order of one round; never decides what the fleet
should do (`loom_operator.fleet.reconcile` does) and never prints (events go to a sink).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from loom_operator.control.planner_metrics import PlannerMetrics
from loom_operator.control.probe import Observer
from loom_operator.control.push_api import PushDesk, Store, push_app, start_push_api
from loom_operator.control.router_admin import RouterAdmin
from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.autoscale import AutoscalePlan
from loom_operator.fleet.controller import Reconciliation, reconcile
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.push import PushConflict, PushUpdate
from loom_operator.fleet.record import FleetRecord
from loom_operator.fleet.store import load_record, save_record
from loom_operator.local.autoscaler import autoscaler_for
from loom_operator.local.card_edits import CardEdits
from loom_operator.local.cards import FleetCards
from loom_operator.local.events import EventSink, FleetEvent
from loom_operator.local.executor import Executor, Round
from loom_operator.local.launch import LaunchOptions
from loom_operator.local.observe import worker_state
from loom_operator.local.ports import free_ports
from loom_operator.local.push import HOST, local_pushes
from loom_operator.local.router_keeper import RouterKeeper
from loom_operator.local.routing import RouterLink
from loom_operator.local.snapshot import (
    FleetStatus,
    ScalingRow,
    condition_rows,
    save_status,
    scaling_rows,
    status_changed,
    weight_sync_row,
    worker_row,
)
from loom_operator.local.state import (
    ControllerInfo,
    ControllerLock,
    Secrets,
    StatePaths,
    load_or_create_secrets,
    save_controller,
)
from loom_operator.local.workers import ProcessSet

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpSettings:
    """How `loom up` runs the fleet; defaults documented here."""

    port: int = 8000
    """The router's port: the fleet's OpenAI endpoint."""
    tick_s: float = 0.3
    """Longest time between two rounds (a round also comes at the core's wake_at)."""
    busy_tick_s: float = 0.1
    """Time to the next round after one that acted on workers (a sync or restart in motion)."""
    router_ready_timeout_s: float = 120.0
    shutdown_drain_s: float | None = None
    """How long Ctrl-C waits for requests to finish; None: the card's drainTimeoutSeconds."""
    stop_grace_s: float = 10.0
    """SIGTERM to SIGKILL when stopping a process."""
    router_backoff_cap_s: float = 30.0
    weights_port: int = 0
    """The weight-push API's port (a trainer connects there); 0 picks a free one."""
    options: LaunchOptions = dataclasses.field(default_factory=LaunchOptions)


class LocalFleet:
    """One deployment's fleet on this machine, run by `run()` until `stop` is set."""

    def __init__(
        self,
        paths: StatePaths,
        cards: FleetCards,
        origin: Path,
        settings: UpSettings,
        events: EventSink,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.paths = paths
        self.cards = cards
        self.settings = settings
        self._events = events
        self._env = dict(os.environ if env is None else env)
        self._lock = ControllerLock(paths)
        self._secrets: Secrets | None = None
        self.record = FleetRecord()
        self.last: Reconciliation | None = None
        self.status: FleetStatus | None = None
        """The latest snapshot (also in status.json, rewritten when it changes)."""
        self._written: FleetStatus | None = None
        self._edits = CardEdits(paths, cards, origin, events)
        self._observed: FleetObservation | None = None
        self._push_api: web.AppRunner | None = None
        self.weights_url = ""
        """The weight-push API a trainer connects to (docs/rl.md), once started."""
        self.metrics = PlannerMetrics()
        """The planner's metrics, on the controller's port at /metrics."""
        self.autoscaler = autoscaler_for(cards.desired, None, events, self.metrics)
        """Loom's planner, when the card has an autoscaling section (docs/autoscaling.md)."""

    # -- start ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Lock the state directory, install the card, adopt or start processes, start the
        router and wait until its admin API answers. On failure (or cancellation) it stops
        what it started and releases the lock; adopted processes keep running."""
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            await self._start()
        except BaseException:
            await self._abort_start()
            raise

    async def _start(self) -> None:
        secrets = load_or_create_secrets(self.paths)
        self._secrets = secrets
        self._edits.install(self.cards)
        self.processes = ProcessSet(self.paths, secrets, self.settings.options, self._env)
        self.observer = Observer(secrets.control_token)
        now = time.time()
        adopted, gone = self.processes.adopt(now)
        if adopted or gone:
            msg = f"adopted {len(adopted)} running worker(s)" + (
                f"; {', '.join(gone)} exited while no controller ran" if gone else ""
            )
            self._events(FleetEvent("adopted", msg))
        self.record = load_record(self.paths.record)
        self.router_keeper = RouterKeeper(
            self.paths,
            self.processes,
            self._events,
            self._env,
            self.settings.port,
            self.settings.router_backoff_cap_s,
        )
        await self.router_keeper.start(self.cards, now, first=True)
        self.router = RouterLink(RouterAdmin(self.router_keeper.admin_url, secrets.admin_token))
        self.executor = Executor(self.processes, self.observer, self.router, self._events)
        self.pushes = local_pushes(
            self.processes, self.observer, self._events, self.executor.wake.set,
            self.paths.root / "push.json",
        )  # fmt: skip
        await self.router_keeper.wait_ready(self.router, self.settings.router_ready_timeout_s)
        port = self.settings.weights_port or free_ports(1, self.processes.table.ports())[0]
        desk = PushDesk(secrets.admin_token, self._open_push, lambda: self.pushes.latest)

        async def the_fleet(_: Mapping[str, str]) -> PushDesk:
            return desk

        app = push_app(the_fleet)
        app.router.add_get("/metrics", self._serve_metrics)
        self._push_api = await start_push_api(app, HOST, port)
        self.weights_url = f"http://{HOST}:{port}"
        info = ControllerInfo(os.getpid(), now, self.endpoint, self.weights_url)
        save_controller(self.paths, info)

    async def _serve_metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), content_type="text/plain")

    def _open_push(
        self, version: str, mode: str, timeout_s: float, kv: str, store: Store | None
    ) -> PushUpdate:
        if self._observed is None:
            raise PushConflict("the controller has not observed the fleet yet; retry shortly")
        if store is None:  # the trainer runs on this machine: its TCPStore on a free port
            store = (HOST, free_ports(1, self.processes.table.ports())[0])
        return self.pushes.open(
            version, mode, timeout_s, store, self._card_at_counts(), self._observed,
            self.record.sync, kv,
        )  # fmt: skip

    def _card_at_counts(self) -> DesiredFleet:
        """The card's fleet (its weights version) at the workers the planner keeps: what a push
        opens against and is done on."""
        card = self.cards.desired
        return card if self.autoscaler is None else self.autoscaler.apply(card)

    async def _abort_start(self) -> None:
        if self._push_api is not None:
            await self._push_api.cleanup()
        processes: ProcessSet | None = getattr(self, "processes", None)
        keeper: RouterKeeper | None = getattr(self, "router_keeper", None)
        if processes is not None and keeper is not None and keeper.spawned:
            await processes.stop_router(self.settings.stop_grace_s)
        observer: Observer | None = getattr(self, "observer", None)
        if observer is not None:
            await observer.close()
        router: RouterLink | None = getattr(self, "router", None)
        if router is not None:
            await router.admin.close()
        self._lock.release()

    @property
    def endpoint(self) -> str:
        router = self.processes.table.router
        port = router.port if router is not None else self.settings.port
        return f"http://127.0.0.1:{port}/v1"

    # -- rounds ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until `stop` is set (then returns; call `shutdown()`). The next round comes
        after `tick_s`, at the core's wake_at, when a LoadWeights call ends, or — after a round
        that acted on workers — after `busy_tick_s`, so a sync moves on without waiting."""
        while not stop.is_set():
            wake_at = await self.round()
            acted = self.last is not None and any(
                not isinstance(a, SetCondition) for a in self.last.actions
            )
            delay = self.settings.busy_tick_s if acted else self.settings.tick_s
            if wake_at is not None:
                delay = min(delay, max(0.0, wake_at - time.time()))
            await self._sleep(stop, delay)

    async def _sleep(self, stop: asyncio.Event, delay: float) -> None:
        waits = {asyncio.create_task(stop.wait()), asyncio.create_task(self.executor.wake.wait())}
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            self.executor.wake.clear()

    async def round(self) -> float | None:
        """One round; returns the core's wake_at."""
        edited = self._edits.check(self.cards)
        if edited is not None:
            self.autoscaler = autoscaler_for(
                edited.desired, self.autoscaler, self._events, self.metrics
            )
            self.cards = edited
        now = time.time()
        for name in self.processes.notice_exits(now):
            code = self.processes.exit_code(name)
            how = "" if code is None else f" (exit status {code})"
            msg = f"{name} exited{how}; its log: {self.paths.log(name)}"
            self._events(FleetEvent("exited", msg, name, "warning"))
        await self.router_keeper.keep(self.cards, self.router, now)
        observed = await self._observe(now)
        self._observed = observed
        desired = self.pushes.desired(self.cards.desired)
        if self.autoscaler is not None:
            if self.autoscaler.due(now):
                await self._autoscale(observed, now)
            desired = self.autoscaler.apply(desired)
        rec = reconcile(desired, observed, self.record)
        save_record(self.paths.record, rec.record)  # persist before acting
        self.record = rec.record
        self.last = rec
        await self.executor.execute(rec.actions, Round(self.cards, observed, now))
        self.pushes.follow(self._card_at_counts(), observed, rec.record.sync)
        names = {w.name for w in self.processes.table.workers}
        if self.router.known:
            await self._quietly(self.router.remove_unknown(names))
        self._write_status(observed, rec, now)
        return rec.wake_at

    async def _observe(self, now: float) -> FleetObservation:
        members = self.processes.members()
        alive = {w.name: self.processes.alive(w.name) for w in members}
        probes = await self.observer.probe_all(members, alive, now)
        if self.processes.router_alive():
            await self.router.refresh()
            await self.router.refresh_held(self.endpoint.removesuffix("/v1") + "/metrics")
        loading = self.executor.loading
        states = [
            worker_state(
                w,
                alive[w.name],
                probes.get(w.name),
                self.observer.seen(w.name),
                self.router.routed(w.name),
                w.name in loading,
            )
            for w in members
        ]
        return FleetObservation(tuple(states), now, held_requests=self.router.held)

    async def _autoscale(self, observed: FleetObservation, now: float) -> None:
        assert self.autoscaler is not None
        members = self.processes.members()
        urls = {w.name: w.url for w in members if self.processes.alive(w.name)}
        statuses = {w.name: self.observer.seen(w.name).status for w in members}
        await self.autoscaler.decide(urls, observed, statuses, self.router.held, now)

    async def _quietly(self, call: Awaitable[object]) -> None:
        try:
            await call
        except Exception as exc:  # an admin call the next round repeats
            logger.info("router upkeep failed: %s", exc)

    # -- status ---------------------------------------------------------------------------

    def _write_status(self, observed: FleetObservation, rec: Reconciliation, now: float) -> None:
        plan = self.autoscaler.last if self.autoscaler is not None else None
        rows = tuple(
            worker_row(
                w,
                observed.get(w.name),
                self.observer.seen(w.name).status,
                str(self.paths.log(w.name)),
            )
            for w in self.processes.members()
        )
        router = self.processes.table.router
        status = FleetStatus(
            deployment=self.cards.name,
            endpoint=self.endpoint,
            target_version=self.pushes.desired(self.cards.desired).weights_version,
            strategy=self.pushes.desired(self.cards.desired).sync.strategy,
            controller_pid=os.getpid(),
            router_pid=router.pid if router is not None else 0,
            updated_at=now,
            workers=rows,
            conditions=condition_rows(rec.conditions, plan),
            weight_sync=weight_sync_row(
                rec.conditions, self.pushes.desired(self.cards.desired).weights_version
            ),
            scaling=self._scaling_rows(observed, plan),
        )
        self.status = status
        if status_changed(self._written, status, now):
            save_status(self.paths, status)
            self._written = status

    def _scaling_rows(
        self, observed: FleetObservation, plan: AutoscalePlan | None
    ) -> tuple[ScalingRow, ...]:
        if plan is None:
            return ()
        ready: dict[str, int] = {}
        for w in observed.workers:
            ready[w.role] = ready.get(w.role, 0) + int(w.routable)
        return scaling_rows(plan.decisions, ready)

    # -- shutdown -------------------------------------------------------------------------

    async def shutdown(self, drain: bool = True) -> None:
        """Drain (router first, then Pause WAIT, bounded), stop workers, stop the router."""
        try:
            if drain:
                await self._drain()
            await self.processes.stop_all_workers(self.settings.stop_grace_s)
            await self.processes.stop_router(self.settings.stop_grace_s)
            if self.status is not None:
                stopped = dataclasses.replace(
                    self.status, stopped=True, workers=(), updated_at=time.time()
                )
                save_status(self.paths, stopped)
        finally:
            await self.pushes.close()
            if self.autoscaler is not None:
                await self.autoscaler.close()
            if self._push_api is not None:
                await self._push_api.cleanup()
            await self.observer.close()
            await self.router.admin.close()
            with contextlib.suppress(FileNotFoundError):
                self.paths.controller.unlink()
            self._lock.release()

    async def _drain(self) -> None:
        limit = self.settings.shutdown_drain_s
        if limit is None:
            limit = self.cards.desired.sync.drain_timeout_s
        members = [w for w in self.processes.members() if self.processes.alive(w.name)]
        self._events(FleetEvent("draining", f"draining {len(members)} worker(s) (≤{limit:g}s)"))

        async def drain_one(name: str) -> None:
            entry = self.processes.table.get(name)
            if entry is None:
                return
            await self._quietly(self.router.drain(name))
            await self._quietly(self.observer.control(entry).pause("wait", limit))

        await asyncio.gather(*(drain_one(w.name) for w in members))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.executor.wait_loads(), limit)
        for w in members:  # new requests now get a clear 503 instead of waiting for capacity
            await self._quietly(self.router.down(w.name))
