"""The planner on `loom up`: the shared shell (control/autoscaler.py) decides, this one keeps the
workers it decided (how many, and which: the least busy leave, fleet/leaving.py) and says each
change as an event and each decision in the planner's metrics; the round then reconciles the fleet
to them — a new worker starts, a retired one is frozen, drained and only then stopped
(fleet/scaling.py).

Owns the decided workers of a local fleet (in memory: a restarted controller starts again from
the card's); never starts or stops a worker itself and never prints (events go to a sink).
"""

from __future__ import annotations

from collections.abc import Mapping

from loom_operator.api.roles import RoleName
from loom_operator.control.autoscaler import Autoscaler, AutoscalerSettings
from loom_operator.control.planner_metrics import PlannerMetrics
from loom_operator.fleet.autoscale import AutoscalePlan, AutoscalePolicy
from loom_operator.fleet.desired import DesiredFleet, worker_name
from loom_operator.fleet.leaving import kept_indices
from loom_operator.fleet.observed import FleetObservation
from loom_operator.local.events import EventSink, FleetEvent
from loom_runtime.control_api.status import WorkerStatus


class LocalAutoscaler:
    """Holds the workers the planner decided for the roles its policy names: how many, and
    which (a scale-down lets the least busy leave, fleet/leaving.py)."""

    def __init__(
        self,
        policy: AutoscalePolicy,
        start: DesiredFleet,
        events: EventSink,
        metrics: PlannerMetrics,
        settings: AutoscalerSettings | None = None,
    ) -> None:
        self.policy = policy
        self.deployment = start.deployment
        self.indices: dict[RoleName, tuple[int, ...]] = {
            t.role: kept_indices(t.slot_indices, policy.clamp(t.role, t.replicas), {})
            for t in start.roles
        }
        self._planner = Autoscaler(policy, settings)
        self._events = events
        self._metrics = metrics

    @property
    def replicas(self) -> dict[RoleName, int]:
        return {role: len(kept) for role, kept in self.indices.items()}

    @property
    def last(self) -> AutoscalePlan | None:
        return self._planner.last

    def apply(self, desired: DesiredFleet) -> DesiredFleet:
        """The card's fleet with the decided workers of the roles the planner moves."""
        return desired.with_indices(
            {r: kept for r, kept in self.indices.items() if r in self.policy.roles}
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
        """Scrape every worker (`urls`: name → its HTTP base URL), decide, keep the workers."""
        plan = await self._planner.decide(self.replicas, urls, observed, statuses, held, now)
        for d in plan.decisions:
            before = self.indices[d.role]
            after = kept_indices(before, d.desired, self._busy(d.role, before, statuses))
            if d.changed:
                verb = "scaling up" if d.desired > d.current else "scaling down"
                msg = f"{verb} {d.role} {d.current} → {d.desired} ({d.reason}: {d.message})"
                gone = [worker_name(self.deployment, d.role, i) for i in before if i not in after]
                if gone:
                    msg += f"; leaving: {', '.join(gone)} (the least busy)"
                self._events(FleetEvent("autoscale", msg))
            self.indices[d.role] = after
            self._metrics.decision("", self.deployment, d)
            self._metrics.desired("", self.deployment, d.role, len(after))
        return plan

    def _busy(
        self, role: RoleName, indices: tuple[int, ...], statuses: Mapping[str, WorkerStatus | None]
    ) -> dict[int, int]:
        """Requests in flight and queued on each of the role's workers that answered."""
        out = {}
        for i in indices:
            s = statuses.get(worker_name(self.deployment, role, i))
            if s is not None:
                out[i] = s.in_flight + s.num_waiting
        return out

    async def close(self) -> None:
        await self._planner.close()


def autoscaler_for(
    desired: DesiredFleet,
    before: LocalAutoscaler | None,
    events: EventSink,
    metrics: PlannerMetrics,
) -> LocalAutoscaler | None:
    """The planner's shell for a card's fleet (None: no autoscaling section, or its planner is
    off); an unchanged policy keeps the running one, a changed one starts from the replicas
    decided so far. The roles the planner no longer moves leave its metrics."""
    policy = desired.autoscale
    moved = policy.roles if policy is not None and policy.planner else ()
    if before is not None:
        gone = tuple(r for r in before.policy.roles if r not in moved)
        metrics.forget("", before.deployment, gone)
    if policy is None or not policy.planner:
        return None
    if before is not None and before.policy == policy:
        return before
    start = desired if before is None else before.apply(desired)
    return LocalAutoscaler(policy, start, events, metrics)
