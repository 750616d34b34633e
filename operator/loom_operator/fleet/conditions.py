"""The DeploymentCard conditions the fleet controller reports: Ready, Progressing, Degraded,
WeightSyncing, with reasons and messages for humans. Never decides an action; only describes.

Messages change only when the fleet does (no timers in them), so unchanged conditions are not
rewritten every round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loom_operator.fleet.actions import Action, SetCondition, brings_back, takes_out
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.failover import FailoverPlan
from loom_operator.fleet.observed import Coverage, FleetObservation, WorkerState, coverage
from loom_operator.fleet.scaling import ScalingPlan
from loom_operator.fleet.sync import SyncPlan

# Reasons (docs/fleet.md explains each).
ALL_READY = "AllReplicasReady"
PARTIALLY_READY = "PartiallyReady"
FALLBACK = "AggregatedFallback"
NOT_SERVING = "NoRoutableWorkers"
SYNC_HOLDING = "WeightSyncHolding"
SCALED_TO_ZERO = "ScaledToZero"
WEIGHT_SYNC = "WeightSync"
SCALING_DOWN = "ScalingDown"
SCALING_UP = "ScalingUp"
WAITING = "WaitingForWorkers"
RECOVERING = "Recovering"
RECONCILED = "Reconciled"
CRASH_LOOP = "CrashLoop"
WORKER_FAILED = "WorkerFailed"
AS_EXPECTED = "AsExpected"


@dataclass(frozen=True)
class Plans:
    """The parts of one reconciliation the conditions describe."""

    desired: DesiredFleet
    observed: FleetObservation
    failover: FailoverPlan
    scaling: ScalingPlan
    sync: SyncPlan
    actions: tuple[Action, ...]


def projected_routable(observed: FleetObservation, actions: Iterable[Action]) -> list[WorkerState]:
    """Workers that take requests once `actions` are carried out (as far as they can tell)."""
    acts = list(actions)
    out = {n for a in acts if (n := takes_out(a)) is not None}
    back = {n for a in acts if (n := brings_back(a)) is not None}
    return [
        w
        for w in observed.workers
        if w.name not in out and (w.routable or (w.name in back and w.healthy))
    ]


def _roles(desired: DesiredFleet, routable: Sequence[WorkerState]) -> str:
    names = {w.name for w in routable}
    parts = []
    for t in desired.roles:
        slots = [s for s in desired.slots if s.role == t.role]
        parts.append(f"{t.role} {sum(1 for s in slots if s.name in names)}/{t.replicas}")
    return ", ".join(parts)


def _ready(p: Plans, routable: list[WorkerState]) -> SetCondition:
    d = p.desired
    desired_names = {s.name for s in d.slots}
    serving = [w for w in routable if w.name in desired_names]
    roles = _roles(d, serving)
    if not d.slots:
        if d.autoscale is not None:
            msg = (
                "the planner scaled the fleet to zero: a request starts a worker, the router "
                "holds it meanwhile (autoscaling min 0)"
            )
            return SetCondition("Ready", "False", SCALED_TO_ZERO, msg)
        return SetCondition("Ready", "False", SCALED_TO_ZERO, "the card asks for no workers")
    full = len(serving) == len(d.slots) and all(
        w.weights_version == d.weights_version for w in serving
    )
    if full and not p.sync.syncing and not p.scaling.extras:
        msg = f"every worker serves {d.component} {d.weights_version} ({roles})"
        return SetCondition("Ready", "True", ALL_READY, msg)
    cov = coverage(routable, d.disaggregated)
    if cov == Coverage.PAIRED:
        return SetCondition("Ready", "True", PARTIALLY_READY, f"serving with {roles} routable")
    if cov == Coverage.FALLBACK:
        msg = (
            f"serving without disaggregation ({roles} routable): no routable prefill worker "
            "shares a weights version with a routable decode worker, so decode workers prefill "
            "prompts themselves"
        )
        return SetCondition("Ready", "True", FALLBACK, msg)
    if p.sync.syncing and not p.failover.failed and not p.scaling.missing:
        held = p.observed.held_requests
        msg = (
            f"the weight sync has paused what serves requests ({roles} routable); the router "
            f"holds {held} request(s) until a worker serves again: {p.sync.message}"
        )
        return SetCondition("Ready", "False", SYNC_HOLDING, msg)
    why = _why_not_serving(p)
    return SetCondition("Ready", "False", NOT_SERVING, f"nothing can serve requests: {why}")


def _why_not_serving(p: Plans) -> str:
    if p.sync.syncing and p.sync.explains_outage:
        return p.sync.message
    if p.failover.failed:
        return "failed: " + ", ".join(sorted(p.failover.failed))
    if p.scaling.missing:
        return "starting " + ", ".join(p.scaling.missing)
    if p.sync.syncing:
        return p.sync.message
    return "waiting for workers to become ready"


def _progressing(p: Plans, routable: list[WorkerState]) -> SetCondition:
    d = p.desired
    if p.sync.syncing:
        return SetCondition("Progressing", "True", WEIGHT_SYNC, p.sync.message)
    if p.scaling.extras:
        msg = p.scaling.waiting or f"draining {', '.join(p.scaling.extras)} before stopping them"
        return SetCondition("Progressing", "True", SCALING_DOWN, msg)
    if p.scaling.missing:
        msg = f"starting {', '.join(p.scaling.missing)} on {d.weights_version}"
        return SetCondition("Progressing", "True", SCALING_UP, msg)
    names = {w.name for w in routable}
    if p.failover.failed:
        msg = f"restarting {', '.join(sorted(p.failover.failed))} on {d.weights_version}"
        return SetCondition("Progressing", "True", RECOVERING, msg)
    waiting = [s.name for s in d.slots if s.name not in names]
    if waiting:
        msg = f"waiting for {', '.join(waiting)} to become ready"
        return SetCondition("Progressing", "True", WAITING, msg)
    msg = f"the fleet matches the cards ({_roles(d, routable)} on {d.weights_version})"
    return SetCondition("Progressing", "False", RECONCILED, msg)


def _degraded(p: Plans, routable: list[WorkerState]) -> SetCondition:
    f = p.desired.failover
    roles = _roles(p.desired, routable)
    if p.failover.crash_looping:
        looping = [h for h in p.failover.history if h.name in p.failover.crash_looping]
        what = "; ".join(
            f"{h.name} failed {len(h.failures)} times in {f.crash_loop_window_s:g}s "
            f"(last: {h.reason})"
            for h in looping
        )
        msg = (
            f"crash loop: {what}; restarting every {f.backoff_cap_s:g}s — check the worker's "
            f"log; {roles} routable"
        )
        return SetCondition("Degraded", "True", CRASH_LOOP, msg)
    down = [h for h in p.failover.history if h.failed_since is not None]
    if down:
        what = "; ".join(
            f"{h.name} {h.reason}" + ("" if h.name in p.failover.failed else ", restarted")
            for h in down
        )
        msg = f"{what}; capacity is back when it is ready ({roles} routable)"
        return SetCondition("Degraded", "True", WORKER_FAILED, msg)
    return SetCondition("Degraded", "False", AS_EXPECTED, "no worker has failed")


def _weight_syncing(p: Plans, routable: Sequence[WorkerState]) -> SetCondition:
    if not p.sync.syncing:
        return SetCondition("WeightSyncing", "False", p.sync.reason, p.sync.message)
    reason = p.sync.reason
    if reason == p.desired.sync.strategy and coverage(routable, p.desired.disaggregated) == (
        Coverage.FALLBACK
    ):  # the round's other actions (a paused worker resumed) leave only the fallback serving
        reason = FALLBACK
    return SetCondition("WeightSyncing", "True", reason, p.sync.message)


def fleet_conditions(p: Plans) -> tuple[SetCondition, ...]:
    """Ready, Progressing, Degraded and WeightSyncing, as they stand after `p.actions`."""
    routable = projected_routable(p.observed, p.actions)
    return (
        _ready(p, routable),
        _progressing(p, routable),
        _degraded(p, routable),
        _weight_syncing(p, routable),
    )
