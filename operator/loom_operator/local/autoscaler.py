"""The planner on `loom up`: the shared shell (control/autoscaler.py) decides, this one keeps the
replicas it decided and says each change as an event; the round then reconciles the fleet to
them — a new worker starts, a retired one is frozen, drained and only then stopped
(fleet/scaling.py).

Owns the decided replicas of a local fleet (in memory: a restarted controller starts again from
the card's); never starts or stops a worker itself and never prints (events go to a sink).
"""

from __future__ import annotations

from collections.abc import Mapping

from loom_operator.api.roles import RoleName
from loom_operator.control.autoscaler import Autoscaler, AutoscalerSettings
from loom_operator.fleet.autoscale import AutoscalePlan, AutoscalePolicy
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.observed import FleetObservation
from loom_operator.local.events import EventSink, FleetEvent
from loom_runtime.control_api.status import WorkerStatus


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
        self.replicas: dict[RoleName, int] = {
            t.role: policy.clamp(t.role, t.replicas) for t in start.roles
        }
        self._planner = Autoscaler(policy, settings)
        self._events = events

    @property
    def last(self) -> AutoscalePlan | None:
        return self._planner.last

    def apply(self, desired: DesiredFleet) -> DesiredFleet:
        """The card's fleet with the decided replicas of the roles the planner moves."""
        return desired.with_replicas(
            {r: n for r, n in self.replicas.items() if r in self.policy.roles}
        )

    def due(self, now: float) -> bool:
        return self._planner.due(now)

    async def decide(
        self,
        urls: Mapping[str, str],
        observed: FleetObservation,
        statuses: Mapping[str, WorkerStatus | None],
        held: int,
        now: float,
    ) -> AutoscalePlan:
        """Scrape every worker (`urls`: name → its HTTP base URL), decide, keep the replicas."""
        plan = await self._planner.decide(self.replicas, urls, observed, statuses, held, now)
        for d in plan.decisions:
            if d.changed:
                verb = "scaling up" if d.desired > d.current else "scaling down"
                msg = f"{verb} {d.role} {d.current} → {d.desired} ({d.reason}: {d.message})"
                self._events(FleetEvent("autoscale", msg))
            self.replicas[d.role] = d.desired
        return plan

    async def close(self) -> None:
        await self._planner.close()


def autoscaler_for(
    desired: DesiredFleet, before: LocalAutoscaler | None, events: EventSink
) -> LocalAutoscaler | None:
    """The planner's shell for a card's fleet (None: no autoscaling section, or its planner is
    off); an unchanged policy keeps the running one, a changed one starts from the replicas
    decided so far."""
    policy = desired.autoscale
    if policy is None or not policy.planner:
        return None
    if before is not None and before.policy == policy:
        return before
    start = desired if before is None else before.apply(desired)
    return LocalAutoscaler(policy, start, events)
