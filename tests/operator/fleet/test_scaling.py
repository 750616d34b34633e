"""Scaling: missing workers start on the target version; extra workers are frozen, drained (or
migrated past the drain timeout) and only then stopped, never while the router sends to them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from loom_operator.fleet.actions import Freeze, MigrateRequests, RouteOff, StartWorker, StopWorker
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.record import Retirement
from loom_operator.fleet.scaling import extra_workers, plan_scaling


def test_missing_workers_start_on_the_target_version(fleet: Any, worker: Any) -> None:
    desired = fleet({"prefill": 1, "decode": 2}, version="v3")
    plan = plan_scaling(desired, FleetObservation((worker("decode", 0, "v3"),), 0.0), ())
    assert plan.actions == (
        StartWorker("dep-prefill-0", "prefill", "file:///models/v3", "v3"),
        StartWorker("dep-decode-1", "decode", "file:///models/v3", "v3"),
    )
    assert plan.missing == ("dep-prefill-0", "dep-decode-1")


def test_extra_worker_is_frozen_then_stopped_once_idle(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 1}, version="v1")
    keep = worker("decode", 0, "v1")
    extra = worker("decode", 1, "v1", in_flight=2)
    first = plan_scaling(desired, FleetObservation((keep, extra), 0.0), ())
    assert first.actions == (Freeze("dep-decode-1"),)
    assert first.retiring == (Retirement("dep-decode-1", since=0.0),)
    frozen = replace(extra, routed=False, admission_open=False)
    busy = plan_scaling(desired, FleetObservation((keep, frozen), 3.0), first.retiring)
    assert busy.actions == ()  # draining: nothing to do yet
    idle = replace(frozen, in_flight=0)
    done = plan_scaling(desired, FleetObservation((keep, idle), 4.0), busy.retiring)
    assert done.actions == (StopWorker("dep-decode-1", "scaled down"),)


def test_a_drain_past_its_timeout_is_migrated_then_stopped(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 1}, version="v1", drain_s=10.0)
    keep = worker("decode", 0, "v1")
    stuck = worker("decode", 1, "v1", in_flight=2, routed=False, admission_open=False)
    retiring = (Retirement("dep-decode-1", since=0.0),)
    plan = plan_scaling(desired, FleetObservation((keep, stuck), 10.0), retiring)
    assert [type(a) for a in plan.actions] == [MigrateRequests]
    assert plan.actions[0].abort  # type: ignore[union-attr]
    assert plan.retiring[0].migrated_at == 10.0 and plan.wake_at == 20.0
    later = plan_scaling(desired, FleetObservation((keep, stuck), 20.0), plan.retiring)
    assert later.actions == (StopWorker("dep-decode-1", "scaled down"),)


def test_a_routed_extra_is_never_stopped_even_when_idle(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 1}, version="v1")
    idle_but_routed = worker("decode", 1, "v1", admission_open=False)
    retiring = (Retirement("dep-decode-1", since=0.0),)
    plan = plan_scaling(
        desired, FleetObservation((worker("decode", 0, "v1"), idle_but_routed), 1.0), retiring
    )
    assert plan.actions == (Freeze("dep-decode-1"),)


def test_a_dead_extra_is_routed_off_and_stopped(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 1}, version="v1")
    dead = worker("decode", 1, "v1", alive=False, ready=False)
    plan = plan_scaling(desired, FleetObservation((worker("decode", 0, "v1"), dead), 1.0), ())
    assert [type(a) for a in plan.actions] == [RouteOff, StopWorker]


def test_extras_wait_until_the_desired_workers_serve_without_them(fleet: Any, worker: Any) -> None:
    """Switching aggregated → prefill/decode: the old workers serve until a new pair does."""
    desired = fleet({"prefill": 1, "decode": 1}, version="v1")
    old = worker("aggregated", 0, "v1")
    starting = (
        worker("prefill", 0, "v1", ready=False, routed=False),
        worker("decode", 0, "v1", ready=False, routed=False),
    )
    plan = plan_scaling(desired, FleetObservation((old, *starting), 5.0), ())
    assert plan.actions == () and plan.retiring == ()
    assert "dep-aggregated-0" in plan.waiting
    serving = tuple(replace(w, ready=True, routed=True) for w in starting)
    plan = plan_scaling(desired, FleetObservation((old, *serving), 6.0), ())
    assert plan.actions == (Freeze("dep-aggregated-0"),) and plan.waiting == ""


def test_scale_to_zero_retires_everything(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 0}, version="v1")
    plan = plan_scaling(desired, FleetObservation((worker("decode", 0, "v1"),), 0.0), ())
    assert plan.actions == (Freeze("dep-decode-0"),)


def test_a_worker_whose_role_was_dropped_is_an_extra(fleet: Any, worker: Any) -> None:
    desired = fleet({"aggregated": 1}, version="v1")
    obs = FleetObservation((worker("aggregated", 0, "v1"), worker("decode", 0, "v1")), 0.0)
    assert [w.name for w in extra_workers(desired, obs)] == ["dep-decode-0"]
