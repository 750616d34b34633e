"""Failover policy: which workers failed, taking them out of routing, restarting them with backoff.

Owns failure detection, restart backoff and crash-loop detection over plain data; never restarts
anything itself, never reads a clock (time is `FleetObservation.now`), and never touches a worker
that is not desired (scaling retires those).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from loom_operator.fleet.actions import MigrateRequests, RestartWorker, RouteOff, WorkerAction
from loom_operator.fleet.desired import DesiredFleet, FailoverPolicy, WorkerSlot
from loom_operator.fleet.observed import FleetObservation, WorkerState
from loom_operator.fleet.record import MAX_FAILURES, WorkerHistory


def worker_failure(w: WorkerState, policy: FailoverPolicy, now: float) -> str | None:
    """Why `w` counts as failed at `now`, or None.

    Failed: it exited; or it was ready since it (re)started and has not passed its probe for
    longer than the health timeout; or it has not become ready within the startup timeout.
    """
    if not w.alive:
        return "exited"
    if w.ready:
        return None
    seen_since_start = w.last_seen is not None and (
        w.started_at is None or w.last_seen >= w.started_at
    )
    if seen_since_start and w.last_seen is not None:
        if now - w.last_seen > policy.health_timeout_s:
            return f"unresponsive: no passing health probe for over {policy.health_timeout_s:g}s"
    elif w.started_at is not None and now - w.started_at > policy.startup_timeout_s:
        return f"not ready {policy.startup_timeout_s:g}s after it started"
    return None


def failure_deadline(w: WorkerState, policy: FailoverPolicy) -> float | None:
    """When an alive, unready `w` will count as failed if nothing changes, or None."""
    if not w.alive or w.ready:
        return None
    if w.last_seen is not None and (w.started_at is None or w.last_seen >= w.started_at):
        return w.last_seen + policy.health_timeout_s
    return None if w.started_at is None else w.started_at + policy.startup_timeout_s


def backoff_delay(failures: int, policy: FailoverPolicy) -> float:
    """Wait before restarting after the `failures`-th failure in the window: base, 2×base, 4×base
    … capped; a crash-looping worker waits the cap."""
    if failures >= policy.crash_loop_failures:
        return policy.backoff_cap_s
    exponent = max(failures, 1) - 1
    return float(min(policy.backoff_cap_s, policy.backoff_base_s * 2**exponent))


def crash_looping(h: WorkerHistory, policy: FailoverPolicy, now: float) -> bool:
    """True when the worker failed `crash_loop_failures` times within the window."""
    recent = [t for t in h.failures if t > now - policy.crash_loop_window_s]
    return len(recent) >= policy.crash_loop_failures


@dataclass(frozen=True)
class FailoverPlan:
    """What failover does this round and what it now remembers."""

    actions: tuple[WorkerAction, ...]
    history: tuple[WorkerHistory, ...]
    failed: Mapping[str, str]
    """Desired workers failed now -> why."""
    crash_looping: tuple[str, ...]
    """Workers with too many failures in the window (reported, never hidden)."""
    wake_at: float | None
    """The next time a restart falls due or a worker times out, if nothing else changes."""


@dataclass(frozen=True)
class _WorkerPlan:
    actions: tuple[WorkerAction, ...]
    history: WorkerHistory
    failure: str | None
    wake_at: float | None


def _record_failure(
    w: WorkerState, h: WorkerHistory, failure: str | None, now: float, window: float
) -> tuple[WorkerHistory, bool]:
    """`h` with a new failure added if `w` failed anew (exited again, or newly failed)."""
    failures = [t for t in h.failures if t > now - window]
    exited_again = w.last_exit_at is not None and (
        h.last_exit_at is None or w.last_exit_at > h.last_exit_at
    )
    new = exited_again or (failure is not None and h.failed_since is None)
    if new:
        at = w.last_exit_at if exited_again and w.last_exit_at is not None else now
        if at > now - window:
            failures.append(at)
    failed_since = h.failed_since
    if failure is not None and failed_since is None:
        failed_since = w.last_exit_at if exited_again and w.last_exit_at is not None else now
    elif failure is None and w.healthy:
        failed_since = None
    updated = replace(
        h,
        failures=tuple(sorted(failures)[-MAX_FAILURES:]),
        failed_since=failed_since,
        reason=failure or h.reason,
        last_exit_at=w.last_exit_at if exited_again else h.last_exit_at,
    )
    return updated, new


def _plan_worker(
    slot: WorkerSlot, w: WorkerState, h: WorkerHistory, desired: DesiredFleet, now: float
) -> _WorkerPlan:
    policy = desired.failover
    failure = worker_failure(w, policy, now)
    h, new = _record_failure(w, h, failure, now, policy.crash_loop_window_s)
    if failure is None:
        return _WorkerPlan((), h, None, failure_deadline(w, policy))
    actions: list[WorkerAction] = []
    why = f"{w.name} {failure}"
    if w.routed:
        actions.append(RouteOff(w.name, why))
    if new:
        actions.append(MigrateRequests(w.name, abort=False, reason=why))
    attempt = max(len(h.failures), 1)
    delay = backoff_delay(attempt, policy)
    anchors = [t for t in (h.failed_since, w.last_exit_at, h.last_restart_at) if t is not None]
    due = max(anchors, default=now) + delay
    if now < due:
        return _WorkerPlan(tuple(actions), h, failure, due)
    actions.append(
        RestartWorker(
            w.name,
            slot.role,
            desired.source_uri,
            desired.weights_version,
            attempt,
            delay,
            failure,
        )
    )
    return _WorkerPlan(tuple(actions), replace(h, last_restart_at=now), failure, None)


def plan_failover(
    desired: DesiredFleet, observed: FleetObservation, history: tuple[WorkerHistory, ...]
) -> FailoverPlan:
    """RouteOff + MigrateRequests at once for each failed desired worker, RestartWorker (on the
    target version) once its backoff has passed; remember failures for backoff and crash loops."""
    now = observed.now
    past = {h.name: h for h in history}
    actions: list[WorkerAction] = []
    kept: list[WorkerHistory] = []
    failed: dict[str, str] = {}
    wakes: list[float] = []
    for slot in desired.slots:
        h = past.get(slot.name, WorkerHistory(slot.name))
        w = observed.get(slot.name)
        if w is None or w.role != slot.role:  # missing: scaling starts it; wrong role: retires it
            kept.append(h)
            continue
        plan = _plan_worker(slot, w, h, desired, now)
        actions.extend(plan.actions)
        kept.append(plan.history)
        if plan.failure is not None:
            failed[slot.name] = plan.failure
        if plan.wake_at is not None:
            wakes.append(plan.wake_at)
    policy = desired.failover
    remembered = tuple(h for h in kept if h != WorkerHistory(h.name))
    looping = tuple(h.name for h in remembered if crash_looping(h, policy, now))
    return FailoverPlan(
        actions=tuple(actions),
        history=remembered,
        failed=MappingProxyType(failed),
        crash_looping=looping,
        wake_at=min(wakes, default=None),
    )
