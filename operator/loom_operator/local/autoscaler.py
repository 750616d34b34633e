"""The planner's shell on `loom up`: every `every_s` it scrapes each worker's /metrics, builds each
role's signals (control/role_metrics.py), asks the planner (fleet/autoscale.py) and keeps the
replicas it decided; the round then reconciles the fleet to them — a new worker starts, a
retired one is frozen, drained and only then stopped (fleet/scaling.py).

Owns the scrape timing, the samples kept per worker (bounded by the window) and the decided
replicas; never starts or stops a worker itself and never prints (events go to a sink).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from loom_operator.api.roles import RoleName
from loom_operator.control.role_metrics import WorkerSample, parse_sample, role_signals
from loom_operator.fleet.autoscale import (
    AutoscalePlan,
    AutoscalePolicy,
    Recommendation,
    plan_autoscale,
)
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.observed import FleetObservation
from loom_operator.local.events import EventSink, FleetEvent
from loom_runtime.control_api.status import WorkerStatus

logger = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class AutoscalerSettings:
    every_s: float = 5.0
    """Time between two decisions (each one scrapes every worker once)."""
    window_s: float = 30.0
    """The latency signals cover what finished in this window."""


class LocalAutoscaler:
    """Holds the replicas the planner decided for the roles its policy names."""

    def __init__(
        self,
        policy: AutoscalePolicy,
        start: DesiredFleet,
        events: EventSink,
        settings: AutoscalerSettings | None = None,
    ) -> None:
        self.policy = policy
        self.settings = settings or AutoscalerSettings()
        self.replicas: dict[RoleName, int] = {
            t.role: _within(policy, t.role, t.replicas) for t in start.roles
        }
        self.last: AutoscalePlan | None = None
        self._events = events
        self._history: Mapping[RoleName, tuple[Recommendation, ...]] = {}
        self._samples: dict[str, deque[WorkerSample]] = {}
        self._next_at = 0.0
        self._session: aiohttp.ClientSession | None = None

    def apply(self, desired: DesiredFleet) -> DesiredFleet:
        """The card's fleet with the decided replicas of the roles the planner moves."""
        return desired.with_replicas(
            {r: n for r, n in self.replicas.items() if r in self.policy.roles}
        )

    def due(self, now: float) -> bool:
        return now >= self._next_at

    async def decide(
        self,
        urls: Mapping[str, str],
        observed: FleetObservation,
        statuses: Mapping[str, WorkerStatus | None],
        held: int,
        now: float,
    ) -> AutoscalePlan:
        """Scrape every worker (`urls`: name → its HTTP base URL), decide, keep the replicas."""
        self._next_at = now + self.settings.every_s
        await self._scrape(urls, now)
        signals = [
            role_signals(role, self.replicas[role], observed.workers, statuses, self._samples,
                         held, now, self.settings.window_s)
            for role in self.replicas
            if role in self.policy.roles
        ]  # fmt: skip
        plan = plan_autoscale(self.policy, signals, self._history, now)
        self._history = plan.history
        self.last = plan
        for d in plan.decisions:
            if d.changed:
                verb = "scaling up" if d.desired > d.current else "scaling down"
                msg = f"{verb} {d.role} {d.current} → {d.desired} ({d.reason}: {d.message})"
                self._events(FleetEvent("autoscale", msg))
            self.replicas[d.role] = d.desired
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
        keep = int(self.settings.window_s / self.settings.every_s) + 2
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


def autoscaler_for(
    desired: DesiredFleet, before: LocalAutoscaler | None, events: EventSink
) -> LocalAutoscaler | None:
    """The planner's shell for a card's fleet (None: no autoscaling section); an unchanged
    policy keeps the running one, a changed one starts from the replicas decided so far."""
    policy = desired.autoscale
    if policy is None:
        return None
    if before is not None and before.policy == policy:
        return before
    start = desired if before is None else before.apply(desired)
    return LocalAutoscaler(policy, start, events)


def _within(policy: AutoscalePolicy, role: RoleName, replicas: int) -> int:
    bounds = policy.roles.get(role)
    return replicas if bounds is None else bounds.clamp(replicas)


async def _get(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url) as reply:
            return await reply.text() if reply.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None
