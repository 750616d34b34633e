"""Failover: a failed worker leaves routing at once, is restarted on the target version with a
backoff that doubles and caps, and a crash loop is reported with the worker named."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from loom_operator.fleet.actions import MigrateRequests, RestartWorker, RouteOff
from loom_operator.fleet.controller import reconcile
from loom_operator.fleet.desired import FailoverPolicy
from loom_operator.fleet.failover import (
    backoff_delay,
    failure_deadline,
    plan_failover,
    worker_failure,
)
from loom_operator.fleet.observed import FleetObservation, WorkerState
from loom_operator.fleet.record import FleetRecord, WorkerHistory

POLICY = FailoverPolicy(
    health_timeout_s=2.0,
    startup_timeout_s=30.0,
    backoff_base_s=1.0,
    backoff_cap_s=8.0,
    crash_loop_failures=5,
    crash_loop_window_s=60.0,
)


def _w(**kw: Any) -> WorkerState:
    fields: dict[str, Any] = {"started_at": 0.0, "last_seen": 10.0}
    fields.update(kw)
    return WorkerState(name="dep-decode-0", role="decode", weights_version="v1", **fields)


@pytest.mark.parametrize(
    ("fields", "now", "failure"),
    [
        ({}, 100.0, None),  # ready: fine however long ago it was probed by us
        ({"alive": False, "ready": False}, 10.0, "exited"),
        ({"ready": False}, 11.9, None),  # unready, within the health timeout
        ({"ready": False}, 12.1, "unresponsive"),
        ({"ready": False, "started_at": 20.0, "last_seen": 10.0}, 49.0, None),  # starting
        ({"ready": False, "started_at": 20.0, "last_seen": 10.0}, 50.5, "not ready 30s"),
        ({"ready": False, "started_at": 20.0, "last_seen": None}, 40.0, None),
        ({"ready": False, "started_at": None, "last_seen": None}, 1e6, None),  # nothing known
    ],
)
def test_worker_failure(fields: dict[str, Any], now: float, failure: str | None) -> None:
    got = worker_failure(_w(**fields), POLICY, now)
    assert (got is None) == (failure is None)
    if failure is not None:
        assert got is not None and failure in got


@pytest.mark.parametrize(
    ("fields", "deadline"),
    [
        ({}, None),
        ({"ready": False}, 12.0),
        ({"ready": False, "started_at": 20.0}, 50.0),
        ({"alive": False, "ready": False}, None),
    ],
)
def test_failure_deadline(fields: dict[str, Any], deadline: float | None) -> None:
    assert failure_deadline(_w(**fields), POLICY) == deadline


@pytest.mark.parametrize(
    ("failures", "delay"),
    [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (9, 8.0)],
)
def test_backoff_doubles_then_caps(failures: int, delay: float) -> None:
    assert backoff_delay(failures, POLICY) == delay


def test_backoff_stays_at_the_cap_in_a_crash_loop_even_if_doubling_would_be_shorter() -> None:
    slow_cap = replace(POLICY, backoff_cap_s=100.0, crash_loop_failures=3)
    assert backoff_delay(2, slow_cap) == 2.0
    assert backoff_delay(3, slow_cap) == 100.0


def test_a_dead_worker_is_routed_off_and_migrated_at_once_and_restarted_after_backoff(
    fleet: Any, worker: Any
) -> None:
    desired = fleet({"decode": 1}, version="v2")
    dead = worker("decode", 0, "v1", alive=False, ready=False, last_exit_at=10.0)
    now = FleetObservation((dead,), now=10.0)
    plan = plan_failover(desired, now, ())
    assert plan.actions == (
        RouteOff("dep-decode-0", "dep-decode-0 exited"),
        MigrateRequests("dep-decode-0", abort=False, reason="dep-decode-0 exited"),
    )
    assert plan.failed == {"dep-decode-0": "exited"}
    assert plan.wake_at == 11.0
    # the router has let go of it; a second before the backoff nothing more happens
    gone = replace(dead, routed=False)
    early = plan_failover(desired, FleetObservation((gone,), 10.5), plan.history)
    assert early.actions == ()
    due = plan_failover(desired, FleetObservation((gone,), 11.0), plan.history)
    assert due.actions == (
        RestartWorker("dep-decode-0", "decode", "file:///models/v2", "v2", 1, 1.0, "exited"),
    )


def test_kill_through_reconcile_lists_route_off_before_anything_else(
    fleet: Any, worker: Any
) -> None:
    desired = fleet({"prefill": 1, "decode": 2}, version="v1")
    workers = (
        worker("prefill", 0, "v1"),
        worker("decode", 0, "v1", alive=False, ready=False, last_exit_at=5.0),
        worker("decode", 1, "v1"),
    )
    rec = reconcile(desired, FleetObservation(workers, now=5.0), FleetRecord())
    assert isinstance(rec.actions[0], RouteOff) and rec.actions[0].worker == "dep-decode-0"
    degraded = rec.condition("Degraded")
    assert (degraded.status, degraded.reason) == ("True", "WorkerFailed")
    assert "dep-decode-0 exited" in degraded.message


def _restarts(desired: Any, worker: Any, cycles: int) -> list[tuple[float, float]]:
    """The worker exits at 0 and half a second after every restart; returns (restart time,
    backoff) of each RestartWorker failover sends, observing every half second."""
    history: tuple[WorkerHistory, ...] = ()
    last_exit, t = 0.0, 0.0
    restarts: list[tuple[float, float]] = []
    while len(restarts) < cycles:
        w = worker(
            "decode", 0, "v1", alive=False, ready=False, routed=False, last_exit_at=last_exit
        )
        plan = plan_failover(desired, FleetObservation((w,), t), history)
        history = plan.history
        for a in plan.actions:
            if isinstance(a, RestartWorker):
                restarts.append((t, a.backoff_s))
                last_exit = t + 0.5
        t += 0.5
    return restarts


def test_backoff_grows_with_each_failure_and_caps(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 1}, version="v1")
    restarts = _restarts(desired, worker, 6)
    assert [b for _, b in restarts] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(restarts)]
    assert gaps == [2.5, 4.5, 8.5, 8.5, 8.5]  # exit half a second after restart, then the wait


def test_crash_loop_is_reported_with_the_worker_named_and_retried_at_the_cap(
    fleet: Any, worker: Any
) -> None:
    desired = fleet({"decode": 2}, version="v1", crash_loop_failures=3)
    record = FleetRecord()
    healthy = worker("decode", 1, "v1")
    restarts: list[RestartWorker] = []
    last_exit = 0.0
    for tick in range(80):  # it exits half a second after every restart
        t = tick / 2
        dead = worker(
            "decode", 0, "v1", alive=False, ready=False, routed=False, last_exit_at=last_exit
        )
        rec = reconcile(desired, FleetObservation((dead, healthy), t), record)
        record = rec.record
        for a in rec.actions:
            if isinstance(a, RestartWorker):
                restarts.append(a)
                last_exit = t + 0.5
    degraded = rec.condition("Degraded")
    assert (degraded.status, degraded.reason) == ("True", "CrashLoop")
    assert "dep-decode-0 failed" in degraded.message and "every 8s" in degraded.message
    assert restarts and restarts[-1].backoff_s == 8.0  # still retried, at the cap
    assert rec.condition("Ready").status == "True"  # the other worker serves; not hidden either


def test_a_hung_worker_is_routed_off_and_restarted_and_not_again_while_it_starts(
    fleet: Any, worker: Any
) -> None:
    desired = fleet({"decode": 1}, version="v1")
    hung = worker("decode", 0, "v1", ready=False, last_seen=10.0)
    plan = plan_failover(desired, FleetObservation((hung,), 12.5), ())
    assert [type(a) for a in plan.actions] == [RouteOff, MigrateRequests]
    assert "unresponsive" in plan.failed["dep-decode-0"]
    plan = plan_failover(
        desired, FleetObservation((replace(hung, routed=False),), 13.5), plan.history
    )
    assert [type(a) for a in plan.actions] == [RestartWorker]
    starting = replace(hung, routed=False, started_at=13.6, last_seen=None)
    later = plan_failover(desired, FleetObservation((starting,), 30.0), plan.history)
    assert later.actions == () and later.failed == {}
    # still counted as failed (Degraded) until it is ready again
    assert later.history[0].failed_since is not None
    ready = replace(starting, ready=True, last_seen=31.0)
    back = plan_failover(desired, FleetObservation((ready,), 31.0), later.history)
    assert back.history == () or back.history[0].failed_since is None


def test_failover_leaves_workers_beyond_the_replicas_to_scaling(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 1}, version="v1")
    extra = worker("decode", 5, "v1", alive=False, ready=False, last_exit_at=1.0)
    plan = plan_failover(desired, FleetObservation((worker("decode", 0, "v1"), extra), 9.0), ())
    assert plan.actions == () and plan.failed == {}


def test_failures_older_than_the_window_are_forgotten(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 1}, version="v1", crash_loop_failures=2)
    old = (WorkerHistory("dep-decode-0", failures=(1.0, 2.0), last_exit_at=2.0),)
    ok = worker("decode", 0, "v1")
    assert plan_failover(desired, FleetObservation((ok,), 30.0), old).crash_looping == (
        "dep-decode-0",
    )
    assert plan_failover(desired, FleetObservation((ok,), 100.0), old).crash_looping == ()
