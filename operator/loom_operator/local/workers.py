"""The processes of one local fleet — workers and the router — and their persisted table.

Owns spawning, adopting (after a controller restart), noticing exits, and stopping them, and
keeps `processes.json` current after every change; never decides which process should run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping

from loom_operator.api.roles import RoleName
from loom_operator.local.cards import FleetCards
from loom_operator.local.launch import (
    HOST,
    LaunchOptions,
    plan_start,
    ports_needed,
    router_argv,
    router_env,
    worker_argv,
    worker_card,
    worker_env,
    worker_ports,
)
from loom_operator.local.ports import free_ports
from loom_operator.local.process import LocalProcess
from loom_operator.local.state import (
    ProcessTable,
    RouterEntry,
    Secrets,
    StatePaths,
    WorkerEntry,
    load_processes,
    save_processes,
    write_atomic,
)

logger = logging.getLogger(__name__)

ROUTER = "router"
STOP_GRACE_S = 15.0  # SIGTERM to SIGKILL for a worker that was drained before


class ProcessSet:
    """The live processes behind the process table (adopted or spawned by this controller)."""

    def __init__(
        self,
        paths: StatePaths,
        secrets: Secrets,
        options: LaunchOptions,
        env: Mapping[str, str],
    ) -> None:
        self._paths = paths
        self._secrets = secrets
        self._options = options
        self._env = dict(env)
        self.table = ProcessTable()
        self._procs: dict[str, LocalProcess] = {}
        self._router: LocalProcess | None = None
        self._stopping: dict[str, asyncio.Task[None]] = {}

    # -- the table -------------------------------------------------------------------------

    def _save(self, table: ProcessTable) -> None:
        self.table = table
        save_processes(self._paths, table)

    def adopt(self, now: float) -> tuple[list[str], list[str]]:
        """Take over the processes of an earlier controller: (adopted names, gone names). A
        worker that is gone is kept with its exit noted, so failover restarts it."""
        table = load_processes(self._paths)
        adopted, gone = [], []
        for entry in table.workers:
            proc = LocalProcess.adopt(entry.name, entry.pid, entry.ident)
            if proc is not None:
                self._procs[entry.name] = proc
                if not entry.stopping:
                    adopted.append(entry.name)
            elif entry.stopping:
                table = table.without(entry.name)
            else:
                gone.append(entry.name)
                if entry.last_exit_at is None or entry.last_exit_at < entry.started_at:
                    table = table.with_worker(dataclasses.replace(entry, last_exit_at=now))
        if table.router is not None:
            self._router = LocalProcess.adopt(ROUTER, table.router.pid, table.router.ident)
        self._save(table)
        for entry in table.workers:  # a scale-down the last controller did not finish
            if entry.stopping and entry.name in self._procs:
                self._stopping[entry.name] = asyncio.create_task(self._stop(entry.name))
        return adopted, gone

    def notice_exits(self, now: float) -> list[str]:
        """Workers found exited since they last started (their exit time is recorded now)."""
        exited = []
        table = self.table
        for entry in table.workers:
            if entry.stopping or self.alive(entry.name):
                continue
            if entry.last_exit_at is None or entry.last_exit_at < entry.started_at:
                table = table.with_worker(dataclasses.replace(entry, last_exit_at=now))
                exited.append(entry.name)
        if exited:
            self._save(table)
        return exited

    def alive(self, name: str) -> bool:
        proc = self._procs.get(name)
        return proc is not None and proc.alive()

    def exit_code(self, name: str) -> int | None:
        proc = self._procs.get(name)
        return None if proc is None else proc.exit_code()

    def members(self) -> tuple[WorkerEntry, ...]:
        """Workers that are part of the fleet (not being stopped)."""
        return tuple(w for w in self.table.workers if not w.stopping)

    # -- workers ---------------------------------------------------------------------------

    def start_worker(
        self,
        cards: FleetCards,
        name: str,
        role: RoleName,
        source: str,
        version: str,
        now: float,
        workers: int,
    ) -> WorkerEntry:
        """Start (or restart, on new ports) worker `name` loading `source` as `version`."""
        old = self.table.get(name)
        proc = self._procs.pop(name, None)
        if proc is not None and proc.alive():
            proc.kill()
        avoid = self.table.ports()
        ports = worker_ports(role, free_ports(ports_needed(role), avoid))
        card_path = self._paths.worker_card(name).resolve()
        peers = {
            f"{HOST}:{w.control_port}": w.version
            for w in self.table.workers
            if w.name != name and self.alive(w.name)
        }
        start = plan_start(source, version, cards, peers)
        write_atomic(card_path, worker_card(cards, start.source, start.version))
        argv = worker_argv(cards, role, card_path, ports, start.version, self._options)
        argv += start.flags()
        env = worker_env(self._env, self._secrets.control_token, workers, self._options)
        proc = LocalProcess.spawn(name, argv, env, self._paths.log(name))
        self._procs[name] = proc
        entry = WorkerEntry(
            name=name,
            role=role,
            pid=proc.pid,
            ident=proc.ident,
            started_at=now,
            http_port=ports.http,
            control_port=ports.control,
            kv_events_port=ports.kv_events,
            kv_replay_port=ports.kv_replay,
            kv_side_port=ports.kv_side,
            version=version,
            source=source,
            restarts=0 if old is None else old.restarts + 1,
            last_exit_at=None if old is None else old.last_exit_at,
        )
        self._save(self.table.with_worker(entry))
        return entry

    def record_version(self, name: str, version: str) -> None:
        """Worker `name` now serves `version` (a LoadWeights finished): the table says so."""
        entry = self.table.get(name)
        if entry is not None and entry.version != version:
            self._save(self.table.with_worker(dataclasses.replace(entry, version=version)))

    def stop_worker(self, name: str) -> None:
        """Begin stopping `name` (it leaves the fleet now; the process ends in the background)."""
        entry = self.table.get(name)
        if entry is None or name in self._stopping:
            return
        self._save(self.table.with_worker(dataclasses.replace(entry, stopping=True)))
        self._stopping[name] = asyncio.create_task(self._stop(name), name=f"stop-{name}")

    async def _stop(self, name: str) -> None:
        proc = self._procs.get(name)
        try:
            if proc is not None:
                await proc.stop(STOP_GRACE_S)
        finally:
            self._procs.pop(name, None)
            self._stopping.pop(name, None)
            self._save(self.table.without(name))

    async def stop_all_workers(self, grace_s: float) -> None:
        """Stop every worker (SIGTERM together, SIGKILL after `grace_s`); empty the table."""
        procs = [p for p in self._procs.values() if p.alive()]
        await asyncio.gather(*(p.stop(grace_s) for p in procs))
        for task in list(self._stopping.values()):
            await task
        self._procs.clear()
        self._save(dataclasses.replace(self.table, workers=()))

    # -- the router ------------------------------------------------------------------------

    def router_alive(self) -> bool:
        return self._router is not None and self._router.alive()

    def start_router(self, port: int, admin_port: int, now: float) -> RouterEntry:
        """Start the router on `port` (the fleet's endpoint) with `router_config` written."""
        old = self.table.router
        if self._router is not None and self._router.alive():
            self._router.kill()
        argv = router_argv(self._paths.router_config.resolve(), port, admin_port, self._options)
        env = router_env(self._env, self._secrets.admin_token)
        self._router = LocalProcess.spawn(ROUTER, argv, env, self._paths.log(ROUTER))
        entry = RouterEntry(
            pid=self._router.pid,
            ident=self._router.ident,
            started_at=now,
            port=port,
            admin_port=admin_port,
            restarts=0 if old is None else old.restarts + 1,
        )
        self._save(dataclasses.replace(self.table, router=entry))
        return entry

    async def stop_router(self, grace_s: float) -> None:
        if self._router is not None:
            await self._router.stop(grace_s)
            self._router = None
        self._save(dataclasses.replace(self.table, router=None))
