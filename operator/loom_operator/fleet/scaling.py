"""Scaling: start desired workers that do not exist; drain, then stop workers beyond the replicas.

Owns the start and retire decisions over plain data; never stops a worker the router may still
send to (it is frozen and drained first), never restarts a failed worker (failover does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from loom_operator.fleet.actions import (
    Freeze,
    MigrateRequests,
    RouteOff,
    StartWorker,
    StopWorker,
    WorkerAction,
)
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.observed import FleetObservation, WorkerState, coverage
from loom_operator.fleet.record import Retirement


@dataclass(frozen=True)
class ScalingPlan:
    """What scaling does this round and which workers are retiring."""

    actions: tuple[WorkerAction, ...]
    retiring: tuple[Retirement, ...]
    extras: tuple[str, ...]
    """Workers beyond the desired fleet (retiring or waiting to)."""
    missing: tuple[str, ...]
    """Desired workers the substrate does not know yet (StartWorker sent)."""
    waiting: str
    """Why extras are kept for now ('' when they are not)."""
    wake_at: float | None


def extra_workers(desired: DesiredFleet, observed: FleetObservation) -> tuple[WorkerState, ...]:
    """Workers that no desired slot names (a higher index, or a role the card dropped)."""
    out = []
    for w in observed.workers:
        slot = desired.slot(w.name)
        if slot is None or slot.role != w.role:
            out.append(w)
    return tuple(out)


def _may_retire(desired: DesiredFleet, observed: FleetObservation, extras: set[str]) -> bool:
    """Retiring the extras must not lower what the routable fleet can serve, unless the
    card asks for no workers at all."""
    if sum(t.replicas for t in desired.roles) == 0:
        return True
    routable = [w for w in observed.workers if w.routable]
    kept = [w for w in routable if w.name not in extras]
    return coverage(kept, desired.disaggregated) >= coverage(routable, desired.disaggregated)


def _retire(
    w: WorkerState, r: Retirement, drain_s: float, now: float
) -> tuple[list[WorkerAction], Retirement, float | None]:
    """One retiring worker: keep it frozen, migrate past the drain timeout, stop it once idle."""
    if not w.alive:
        acts: list[WorkerAction] = [RouteOff(w.name, f"{w.name} exited")] if w.routed else []
        return [*acts, StopWorker(w.name, "scaled down (it had exited)")], r, None
    acts = [Freeze(w.name)] if w.routed or w.admission_open else []
    if not w.routed and (
        w.busy == 0 or (r.migrated_at is not None and now >= r.migrated_at + drain_s)
    ):
        return [*acts, StopWorker(w.name, "scaled down")], r, None
    if r.migrated_at is None and now >= r.since + drain_s:
        why = f"{w.name} still busy {drain_s:g}s after it began draining for scale-down"
        acts.append(MigrateRequests(w.name, abort=True, reason=why))
        return acts, replace(r, migrated_at=now), now + drain_s
    deadline = r.since + drain_s if r.migrated_at is None else r.migrated_at + drain_s
    return acts, r, deadline


def plan_scaling(
    desired: DesiredFleet, observed: FleetObservation, retiring: tuple[Retirement, ...]
) -> ScalingPlan:
    """StartWorker for each missing desired worker (on the target version); Freeze, drain and
    StopWorker each extra worker, the retirements remembered for their drain timeout."""
    now = observed.now
    actions: list[WorkerAction] = []
    missing = tuple(s.name for s in desired.slots if observed.get(s.name) is None)
    for slot in desired.slots:
        if slot.name in missing:
            actions.append(
                StartWorker(slot.name, slot.role, desired.source_uri, desired.weights_version)
            )
    extras = extra_workers(desired, observed)
    past = {r.name: r for r in retiring}
    names = {w.name for w in extras}
    allowed = _may_retire(desired, observed, names)
    kept: list[Retirement] = []
    wakes: list[float] = []
    for w in extras:
        r = past.get(w.name)
        if r is None:
            if not allowed and w.alive:
                continue
            r = Retirement(w.name, since=now)
        acts, r, wake = _retire(w, r, desired.sync.drain_timeout_s, now)
        actions.extend(acts)
        kept.append(r)
        if wake is not None:
            wakes.append(wake)
    waiting = ""
    if len(kept) < len(extras):
        waiting = f"keeping {', '.join(sorted(names))} until the desired workers serve without them"
    return ScalingPlan(
        actions=tuple(actions),
        retiring=tuple(kept),
        extras=tuple(sorted(names)),
        missing=missing,
        waiting=waiting,
        wake_at=min(wakes, default=None),
    )
