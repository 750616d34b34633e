"""The planner's shell, whatever runs the workers: every `every_s` it scrapes each worker's
/metrics, builds each role's signals (role_metrics.py) and asks the planner (fleet/autoscale.py)
for the replicas of the roles the policy moves.

Owns the scrape timing, the samples kept per worker (bounded by the window) and the planner's
recommendation history; never holds the replicas (its caller does: `loom up` in memory, the
Kubernetes operator in each role's RoleScale) and never starts or stops a worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

import aiohttp

from loom_operator.api.roles import RoleName
from loom_operator.control.role_metrics import WorkerSample, parse_sample, role_signals
from loom_operator.fleet.autoscale import (
    AutoscalePlan,
    AutoscalePolicy,
    Recommendation,
    plan_autoscale,
)
from loom_operator.fleet.observed import FleetObservation
from loom_runtime.control_api.status import WorkerStatus

logger = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class AutoscalerSettings:
    every_s: float = 5.0
    """Time between two decisions (each one scrapes every worker once)."""
    window_s: float = 30.0
    """The latency signals cover what finished in this window."""
    rate_window_s: float = 5.0
    """The load's rates (prompt tokens arrived, tokens generated) cover this window: one round,
    so a burst shows in the next decision (the scale-up window smooths the noise)."""


class Autoscaler:
    """One card's planner rounds: `due`, then `decide` with the replicas the roles run now."""

    def __init__(self, policy: AutoscalePolicy, settings: AutoscalerSettings | None = None) -> None:
        self.policy = policy
        self.settings = settings or AutoscalerSettings()
        self.last: AutoscalePlan | None = None
        self._history: Mapping[RoleName, tuple[Recommendation, ...]] = {}
        self._samples: dict[str, deque[WorkerSample]] = {}
        self._next_at = 0.0
        self._session: aiohttp.ClientSession | None = None

    def due(self, now: float) -> bool:
        return now >= self._next_at

    @property
    def next_at(self) -> float:
        """When the next decision is due."""
        return self._next_at

    async def decide(
        self,
        replicas: Mapping[RoleName, int],
        urls: Mapping[str, str],
        observed: FleetObservation,
        statuses: Mapping[str, WorkerStatus | None],
        held: int,
        now: float,
        unschedulable: Mapping[RoleName, int] | None = None,
    ) -> AutoscalePlan:
        """Scrape every worker (`urls`: name → its HTTP base URL) and decide for each role the
        policy moves, from `replicas` (what each role is asked to run now) and, where the
        substrate knows them, each role's pods no node has room for."""
        self._next_at = now + self.settings.every_s
        await self._scrape(urls, now)
        stuck = unschedulable or {}
        signals = [
            replace(
                role_signals(role, n, observed.workers, statuses, self._samples, held, now,
                             self.settings.window_s, self.settings.rate_window_s),
                unschedulable=stuck.get(role, 0),
            )
            for role, n in replicas.items()
            if role in self.policy.roles
        ]  # fmt: skip
        plan = plan_autoscale(self.policy, signals, self._history, now)
        self._history = plan.history
        self.last = plan
        return plan

    async def _scrape(self, urls: Mapping[str, str], now: float) -> None:
        session = self._session or aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        )
        self._session = session
        names = sorted(urls)
        texts = await asyncio.gather(*(_get(session, urls[n] + "/metrics") for n in names))
        for name in set(self._samples) - set(names):
            del self._samples[name]  # a worker that left takes its samples along
        keep = (
            int(max(self.settings.window_s, self.settings.rate_window_s) / self.settings.every_s)
            + 2
        )
        for name, text in zip(names, texts, strict=True):
            if text is None:
                continue
            try:
                sample = parse_sample(text, now)
            except ValueError as exc:
                logger.info("%s: /metrics unreadable: %s", name, exc)
                continue
            self._samples.setdefault(name, deque(maxlen=keep)).append(sample)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _get(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url) as reply:
            return await reply.text() if reply.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None
