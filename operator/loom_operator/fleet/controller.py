"""The fleet controller: one pure reconciliation from cards, observed workers and the persisted
record to actions, the next record and the conditions. Never performs I/O or reads a clock.

A substrate shell (Kubernetes, `loom up`) observes, calls `reconcile`, persists the record, then
carries out the actions in order, and calls again when something changes or at `wake_at`.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom_operator.fleet.actions import (
    Action,
    Resume,
    RouteOn,
    SetCondition,
    WorkerAction,
    ordered,
)
from loom_operator.fleet.conditions import Plans, fleet_conditions
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.failover import FailoverPlan, plan_failover
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.record import FleetRecord, SyncRecord
from loom_operator.fleet.scaling import plan_scaling
from loom_operator.fleet.sync import holds, plan_sync
from loom_runtime.card.conditions import ConditionType


@dataclass(frozen=True)
class Reconciliation:
    """The result of one round: what to do, what to remember, what to report."""

    actions: tuple[Action, ...]
    """Worker actions in ACTION_ORDER, then SetCondition for each condition that changed."""
    record: FleetRecord
    """Persist this before carrying out the actions."""
    conditions: tuple[SetCondition, ...]
    """Every condition as it stands (Ready, Progressing, Degraded, WeightSyncing)."""
    wake_at: float | None
    """Reconcile again by then even if nothing changes (a backoff or timeout falls due)."""

    def condition(self, type_: ConditionType) -> SetCondition:
        """The condition of type `type_`."""
        return next(c for c in self.conditions if c.type == type_)


def _restore(
    desired: DesiredFleet,
    observed: FleetObservation,
    failover: FailoverPlan,
    sync: SyncRecord | None,
) -> list[WorkerAction]:
    """Put healthy desired workers that nothing holds back into routing (a recovered or new
    worker, or one left paused by a lost action)."""
    acts: list[WorkerAction] = []
    for slot in desired.slots:
        w = observed.get(slot.name)
        if (
            w is None
            or w.role != slot.role
            or not w.healthy
            or w.weights_version is None
            or slot.name in failover.failed
            or holds(sync, slot.name)
        ):
            continue
        if not w.admission_open:
            acts.append(Resume(w.name))
        elif not w.routed:
            acts.append(RouteOn(w.name))
    return acts


def reconcile(
    desired: DesiredFleet, observed: FleetObservation, record: FleetRecord
) -> Reconciliation:
    """One round of the fleet controller (deterministic: same inputs, same output).

    Failover first (failed workers leave routing at once), then scaling (start missing
    workers, drain and stop extras), then the weight sync, then routing back workers that
    nothing holds; conditions describe the fleet as it will be once the actions are done.
    """
    failover = plan_failover(desired, observed, record.failover)
    scaling = plan_scaling(desired, observed, record.retiring)
    sync = plan_sync(desired, observed, record.sync)
    restore = _restore(desired, observed, failover, sync.record)
    worker_actions = ordered([*failover.actions, *scaling.actions, *sync.actions, *restore])
    plans = Plans(desired, observed, failover, scaling, sync, worker_actions)
    conditions = fleet_conditions(plans)
    changed = [c for c in conditions if c not in record.conditions]
    wakes = [t for t in (failover.wake_at, scaling.wake_at, sync.wake_at) if t is not None]
    return Reconciliation(
        actions=(*worker_actions, *changed),
        record=FleetRecord(
            sync=sync.record,
            failover=failover.history,
            retiring=scaling.retiring,
            conditions=conditions,
        ),
        conditions=conditions,
        wake_at=min(wakes, default=None),
    )
