"""Probing workers: /health, gRPC Status, and /metrics for a prefill worker's pending KV pulls,
all at once with timeouts, remembering what each last answered.

Owns the probes of any substrate (a local process or a pod: anything with a name, role, HTTP
URL and control address) and the "ready" rule read from them; never acts on a worker and never
builds a `WorkerState` (each substrate does, from its own facts). A probe that fails keeps the
last values it saw: an unknown in-flight count is never taken for zero.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from loom_operator.api.roles import RoleName
from loom_operator.control.client import ControlClient, ControlError
from loom_runtime.control_api.status import WorkerStatus
from loom_runtime.wire.metric_names import KV_LEASES

logger = logging.getLogger(__name__)


class Target(Protocol):
    """What a probe needs to know of a worker."""

    @property
    def name(self) -> str: ...
    @property
    def role(self) -> RoleName: ...
    @property
    def url(self) -> str: ...
    @property
    def control(self) -> str: ...


PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Probe:
    """One round of probes of one worker."""

    health_ok: bool
    status: WorkerStatus | None
    kv_leases: int | None = None
    """Prefill: KV blocks pinned for decode pulls (None: not asked, or unknown)."""
    error: str = ""


@dataclass(frozen=True)
class Seen:
    """What the observer last knew about a worker (kept across failed probes)."""

    status: WorkerStatus | None = None
    kv_leases: int = 0
    last_seen: float | None = None


def latest_status(probe: Probe | None, seen: Seen) -> WorkerStatus | None:
    """This round's status, or the last one seen when this round's probe did not get one."""
    return probe.status if probe is not None and probe.status is not None else seen.status


def probed_ready(alive: bool, probe: Probe | None) -> bool:
    """The one "ready" rule of every substrate: the worker's process is alive, and this
    round's probe answered both /health and Status, with a state other than failed."""
    return (
        alive
        and probe is not None
        and probe.health_ok
        and probe.status is not None
        and probe.status.state != "failed"
    )


def is_loading(loading: bool, status: WorkerStatus | None) -> bool:
    """Loading: the substrate is loading it, or its last status says so."""
    return loading or (status is not None and status.state == "loading")


def metric_value(text: str, name: str) -> float | None:
    """The first sample of `name` in Prometheus exposition `text`, or None."""
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            try:
                return float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                return None
    return None


class Observer:
    """Probes workers; keeps one control channel per worker address and what it last saw."""

    def __init__(self, token: str, timeout: float = PROBE_TIMEOUT_S) -> None:
        self._token = token
        self._timeout = timeout
        self._clients: dict[str, ControlClient] = {}
        self._seen: dict[str, Seen] = {}
        self._http: aiohttp.ClientSession | None = None

    def control(self, entry: Target) -> ControlClient:
        """The control client of `entry` (a new one when it moved to new ports)."""
        client = self._clients.get(entry.name)
        if client is None or client.target != entry.control:
            if client is not None:
                asyncio.get_running_loop().create_task(client.close())
            client = ControlClient(entry.control, self._token)
            self._clients[entry.name] = client
        return client

    def seen(self, name: str) -> Seen:
        return self._seen.get(name, Seen())

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            timeout = aiohttp.ClientTimeout(total=self._timeout)
            self._http = aiohttp.ClientSession(timeout=timeout)
        return self._http

    async def probe_all(
        self, entries: Iterable[Target], alive: Mapping[str, bool], now: float
    ) -> dict[str, Probe]:
        """Probe every live worker at once; remember what each answered."""
        live = [e for e in entries if alive.get(e.name, False)]
        probes = await asyncio.gather(*(self._probe(e) for e in live))
        out = {}
        for entry, probe in zip(live, probes, strict=True):
            out[entry.name] = probe
            self._remember(entry, probe, now)
        return out

    def forget(self, name: str) -> None:
        """Drop what was seen of `name` (it restarted: its old numbers mean nothing now)."""
        self._seen.pop(name, None)

    def _remember(self, entry: Target, probe: Probe, now: float) -> None:
        old = self.seen(entry.name)
        self._seen[entry.name] = Seen(
            status=probe.status or old.status,
            kv_leases=old.kv_leases if probe.kv_leases is None else probe.kv_leases,
            last_seen=now if probe.health_ok and probe.status is not None else old.last_seen,
        )

    async def _probe(self, entry: Target) -> Probe:
        health, status, leases = await asyncio.gather(
            self._health(entry),
            self._status(entry),
            self._leases(entry) if entry.role == "prefill" else _none(),
        )
        ok, health_error = health
        status_value, status_error = status
        return Probe(ok, status_value, leases, health_error or status_error)

    async def _health(self, entry: Target) -> tuple[bool, str]:
        try:
            async with self._session().get(entry.url + "/health") as r:
                return r.status == 200, "" if r.status == 200 else f"/health {r.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return False, f"/health: {type(exc).__name__}"

    async def _status(self, entry: Target) -> tuple[WorkerStatus | None, str]:
        try:
            return await self.control(entry).status(timeout=self._timeout), ""
        except ControlError as exc:
            return None, str(exc)

    async def _leases(self, entry: Target) -> int | None:
        try:
            async with self._session().get(entry.url + "/metrics") as r:
                if r.status != 200:
                    return None
                value = metric_value(await r.text(), KV_LEASES)
        except (aiohttp.ClientError, TimeoutError):
            return None
        return None if value is None else int(value)


async def _none() -> None:
    return None
