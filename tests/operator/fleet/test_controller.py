"""`reconcile` composes failover, scaling and sync deterministically, puts idle healthy workers
back into routing, and reports conditions (only the changed ones as actions)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from loom_operator.fleet.actions import (
    Freeze,
    RestartWorker,
    Resume,
    RouteOff,
    RouteOn,
    SetCondition,
    StartWorker,
)
from loom_operator.fleet.controller import reconcile
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.record import FleetRecord

FROZEN = {"routed": False, "admission_open": False}


def _conds(rec: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in rec.conditions}


def test_a_fleet_at_its_desired_state_does_nothing_and_reports_ready(
    fleet: Any, worker: Any
) -> None:
    desired = fleet({"prefill": 1, "decode": 2})
    obs = FleetObservation(
        (worker("prefill", 0, "v2"), worker("decode", 0, "v2"), worker("decode", 1, "v2")), 5.0
    )
    first = reconcile(desired, obs, FleetRecord())
    assert all(isinstance(a, SetCondition) for a in first.actions)
    assert _conds(first) == {
        "Ready": ("True", "AllReplicasReady"),
        "Progressing": ("False", "Reconciled"),
        "Degraded": ("False", "AsExpected"),
        "WeightSyncing": ("False", "InSync"),
    }
    assert first.condition("Ready").message == (
        "every worker serves decoder v2 (prefill 1/1, decode 2/2)"
    )
    again = reconcile(desired, obs, first.record)
    assert again.actions == ()  # unchanged conditions are not written again
    assert again.conditions == first.conditions and again.wake_at is None


def test_reconcile_is_deterministic(fleet: Any, worker: Any) -> None:
    desired = fleet({"prefill": 2, "decode": 2})
    obs = FleetObservation(
        (
            worker("prefill", 0, "v1"),
            worker("decode", 0, "v1", alive=False, ready=False, last_exit_at=1.0),
            worker("prefill", 1, "v1"),
            worker("decode", 1, "v1", in_flight=3),
        ),
        2.0,
    )
    assert reconcile(desired, obs, FleetRecord()) == reconcile(desired, obs, FleetRecord())


def test_failover_and_sync_compose_with_route_off_first(fleet: Any, worker: Any) -> None:
    desired = fleet({"prefill": 2, "decode": 2})
    obs = FleetObservation(
        (
            worker("prefill", 0, "v1"),
            worker("decode", 0, "v1"),
            worker("prefill", 1, "v1"),
            worker("decode", 1, "v1", alive=False, ready=False, last_exit_at=2.0),
        ),
        2.0,
    )
    rec = reconcile(desired, obs, FleetRecord())
    kinds = [type(a).__name__ for a in rec.actions if not isinstance(a, SetCondition)]
    assert kinds[0] == "RouteOff"
    # decode-1 is out (failed) and maxUnavailable is 1: the sync takes nobody else out
    assert not any(isinstance(a, Freeze) for a in rec.actions)
    assert _conds(rec)["Degraded"] == ("True", "WorkerFailed")
    assert _conds(rec)["WeightSyncing"] == ("True", "Rolling")
    assert "dep-decode-1 unavailable" in rec.condition("WeightSyncing").message


@pytest.mark.parametrize(
    ("fields", "action"),
    [
        ({"admission_open": False}, Resume),
        (FROZEN, Resume),
        ({"routed": False}, RouteOn),
    ],
)
def test_a_healthy_worker_nothing_holds_is_put_back_into_routing(
    fleet: Any, worker: Any, fields: dict[str, Any], action: type
) -> None:
    desired = fleet({"decode": 1})
    rec = reconcile(
        desired, FleetObservation((worker("decode", 0, "v2", **fields),), 1.0), FleetRecord()
    )
    assert [a for a in rec.actions if not isinstance(a, SetCondition)] == [action("dep-decode-0")]


def test_degraded_until_the_restarted_worker_is_ready_again(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 2})
    ok = worker("decode", 1, "v2")
    dead = worker("decode", 0, "v2", alive=False, ready=False, last_exit_at=0.0)
    rec = reconcile(desired, FleetObservation((dead, ok), 0.0), FleetRecord())
    assert next(type(a) for a in rec.actions if not isinstance(a, SetCondition)) is RouteOff
    rec = reconcile(desired, FleetObservation((replace(dead, routed=False), ok), 1.0), rec.record)
    assert any(isinstance(a, RestartWorker) for a in rec.actions)
    starting = worker(
        "decode",
        0,
        "v2",
        ready=False,
        routed=False,
        started_at=1.0,
        last_seen=None,
        last_exit_at=0.0,
    )
    rec = reconcile(desired, FleetObservation((starting, ok), 2.0), rec.record)
    assert _conds(rec)["Degraded"] == ("True", "WorkerFailed")
    assert "restarted" in rec.condition("Degraded").message
    back = replace(starting, ready=True, last_seen=3.0)
    rec = reconcile(desired, FleetObservation((back, ok), 3.0), rec.record)
    assert RouteOn("dep-decode-0") in rec.actions
    assert _conds(rec)["Degraded"] == ("False", "AsExpected")
    assert _conds(rec)["Ready"] == ("True", "AllReplicasReady")


def test_barrier_says_nothing_serves_and_why(fleet: Any, worker: Any) -> None:
    desired = fleet({"prefill": 1, "decode": 1}, strategy="Barrier")
    obs = FleetObservation((worker("prefill", 0, "v1"), worker("decode", 0, "v1")), 0.0)
    rec = reconcile(desired, obs, FleetRecord())
    assert {a for a in rec.actions if isinstance(a, Freeze)} == {
        Freeze("dep-prefill-0"),
        Freeze("dep-decode-0"),
    }
    ready = rec.condition("Ready")
    assert (ready.status, ready.reason) == ("False", "WeightSyncHolding")
    assert "Barrier" in ready.message and "holds 0 request(s)" in ready.message
    assert _conds(rec)["Progressing"] == ("True", "WeightSync")
    assert rec.wake_at == 10.0  # the drain timeout


def test_a_rolling_sync_with_one_worker_per_role_says_the_router_holds_requests(
    fleet: Any, worker: Any
) -> None:
    """Finding 5: the router held every request of a one-replica Rolling sync, and Ready said
    'NoRoutableWorkers: nothing can serve requests'."""
    desired = fleet({"prefill": 1, "decode": 1}, strategy="Rolling")
    workers = (worker("prefill", 0, "v1"), worker("decode", 0, "v1"))
    rec = reconcile(desired, FleetObservation(workers, 0.0, held_requests=3), FleetRecord())
    ready = rec.condition("Ready")
    assert (ready.status, ready.reason) == ("False", "WeightSyncHolding"), ready
    assert "holds 3 request(s)" in ready.message
    assert _conds(rec)["WeightSyncing"][0] == "True"


def test_bring_up_reports_scaling_up_and_not_degraded(fleet: Any) -> None:
    desired = fleet({"prefill": 1, "decode": 1}, version="v1")
    rec = reconcile(desired, FleetObservation((), 0.0), FleetRecord())
    assert [a.worker for a in rec.actions if isinstance(a, StartWorker)] == [
        "dep-decode-0",
        "dep-prefill-0",
    ]
    assert _conds(rec) == {
        "Ready": ("False", "NoRoutableWorkers"),
        "Progressing": ("True", "ScalingUp"),
        "Degraded": ("False", "AsExpected"),
        "WeightSyncing": ("False", "InSync"),
    }
    assert "starting dep-prefill-0, dep-decode-0" in rec.condition("Ready").message


def test_scale_down_is_progressing_until_the_extra_is_gone(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 1})
    obs = FleetObservation((worker("decode", 0, "v2"), worker("decode", 1, "v2")), 0.0)
    rec = reconcile(desired, obs, FleetRecord())
    assert Freeze("dep-decode-1") in rec.actions
    assert _conds(rec)["Progressing"] == ("True", "ScalingDown")
    assert _conds(rec)["Ready"] == ("True", "PartiallyReady")


def test_scaled_to_zero_is_not_ready_and_says_so(fleet: Any) -> None:
    desired = fleet({"decode": 0})
    rec = reconcile(desired, FleetObservation((), 0.0), FleetRecord())
    assert _conds(rec)["Ready"] == ("False", "ScaledToZero")
