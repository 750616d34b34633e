"""The weight-sync state machine: each worker's step from what it reports (a table), and whole
rounds of `plan_sync` for starting, halting, retargeting and releasing a sync."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from loom_operator.fleet.actions import Freeze, LoadWeights, MigrateRequests, Resume
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.record import SyncRecord, WorkerProgress
from loom_operator.fleet.sync import SyncContext, advance, holds, plan_sync

NOW = 100.0
W = "dep-decode-0"
FROZEN = {"routed": False, "admission_open": False}
LOAD = LoadWeights(W, "file:///models/v2", "v2")


def _ctx(fleet: Any, strategy: str = "Rolling", released: bool = False) -> SyncContext:
    desired = fleet({"decode": 2}, strategy=strategy, drain_s=10.0, load_s=50.0)
    record = SyncRecord(
        "v2",
        desired.source_uri,
        strategy,
        0.0,  # type: ignore[arg-type]
        released_at=1.0 if released else None,
    )
    return SyncContext(desired, record, NOW)


STEPS = [
    # id, progress, worker (None: gone), failure, strategy -> step, actions, progress checks
    (
        "freeze not applied yet: re-assert",
        dict(step="frozen", frozen_at=100.0),
        dict(in_flight=2),
        None,
        "Rolling",
        "frozen",
        [Freeze(W)],
        {},
    ),
    (
        "draining",
        dict(step="frozen", frozen_at=95.0),
        dict(in_flight=2, **FROZEN),
        None,
        "Rolling",
        "frozen",
        [],
        {},
    ),
    (
        "pending KV pulls keep it draining",
        dict(step="frozen", frozen_at=95.0),
        dict(pending_kv_pulls=1, **FROZEN),
        None,
        "Rolling",
        "frozen",
        [],
        {},
    ),
    (
        "drained: load once",
        dict(step="frozen", frozen_at=95.0),
        dict(**FROZEN),
        None,
        "Rolling",
        "drained",
        [LOAD],
        {"loads": 1},
    ),
    (
        "drained and already on target: no load, resume",
        dict(step="frozen", frozen_at=95.0),
        dict(version="v2", **FROZEN),
        None,
        "Rolling",
        "loaded",
        [Resume(W)],
        {"loads": 0},
    ),
    (
        "drain timeout: migrate the rest",
        dict(step="frozen", frozen_at=90.0),
        dict(in_flight=2, **FROZEN),
        None,
        "Rolling",
        "frozen",
        [
            MigrateRequests(
                W, abort=True, reason=f"{W} still busy 10s after it froze for the sync to v2"
            )
        ],
        {"migrated_at": NOW},
    ),
    (
        "migrated once only",
        dict(step="frozen", frozen_at=80.0, migrated_at=90.0),
        dict(in_flight=1, **FROZEN),
        None,
        "Rolling",
        "frozen",
        [],
        {},
    ),
    (
        "a load is running",
        dict(step="frozen", frozen_at=95.0),
        dict(loading=True, **FROZEN),
        None,
        "Rolling",
        "drained",
        [],
        {},
    ),
    (
        "loading",
        dict(step="drained", since=90.0, loads=1),
        dict(loading=True, **FROZEN),
        None,
        "Rolling",
        "drained",
        [],
        {},
    ),
    (
        "load timeout",
        dict(step="drained", since=40.0, loads=1),
        dict(loading=True, **FROZEN),
        None,
        "Rolling",
        "failed",
        [],
        {},
    ),
    (
        "loaded: resume",
        dict(step="drained", since=90.0, loads=1),
        dict(version="v2", **FROZEN),
        None,
        "Rolling",
        "loaded",
        [Resume(W)],
        {},
    ),
    (
        "adopted load of another target ended: load ours",
        dict(step="drained", since=90.0),
        dict(version="v3", **FROZEN),
        None,
        "Rolling",
        "drained",
        [LOAD],
        {"loads": 1},
    ),
    (
        "barrier closed holds a loaded worker frozen",
        dict(step="loaded"),
        dict(version="v2", routed=False),
        None,
        "Barrier",
        "loaded",
        [Freeze(W)],
        {},
    ),
    (
        "barrier closed, frozen: wait",
        dict(step="loaded"),
        dict(version="v2", **FROZEN),
        None,
        "Barrier",
        "loaded",
        [],
        {},
    ),
    (
        "barrier released: resume",
        dict(step="loaded"),
        dict(version="v2", **FROZEN),
        None,
        "Barrier released",
        "loaded",
        [Resume(W)],
        {},
    ),
    (
        "died while draining",
        dict(step="frozen", frozen_at=95.0),
        dict(alive=False, ready=False, **FROZEN),
        "exited",
        "Rolling",
        "failed",
        [],
        {},
    ),
    (
        "gone while loading",
        dict(step="drained", since=95.0),
        None,
        None,
        "Rolling",
        "failed",
        [],
        {},
    ),
    (
        "dead before it started: nothing to do",
        dict(step="pending"),
        dict(alive=False, ready=False),
        "exited",
        "Rolling",
        "pending",
        [],
        {},
    ),
    (
        "restarted on the target after dying",
        dict(step="failed", reason="Died: x"),
        dict(version="v2", routed=False),
        None,
        "Rolling",
        "loaded",
        [Resume(W)],
        {},
    ),
    (
        "restarted on the old version re-enters",
        dict(step="failed", reason="Died: x"),
        dict(version="v1"),
        None,
        "Rolling",
        "pending",
        [],
        {},
    ),
    (
        "load timed out: stay halted",
        dict(step="failed", reason="LoadTimeout: slow"),
        dict(**FROZEN),
        None,
        "Rolling",
        "failed",
        [],
        {},
    ),
    (
        "timed-out load finished late",
        dict(step="failed", reason="LoadTimeout: slow"),
        dict(version="v2", **FROZEN),
        None,
        "Rolling",
        "loaded",
        [Resume(W)],
        {},
    ),
    (
        "pending but a load runs (controller restarted)",
        dict(step="pending"),
        dict(loading=True, **FROZEN),
        None,
        "Rolling",
        "drained",
        [],
        {"taken": "adopted"},
    ),
    (
        "serving the target: done",
        dict(step="frozen", frozen_at=95.0),
        dict(version="v2"),
        None,
        "Rolling",
        "resumed",
        [],
        {},
    ),
    (
        "restarted onto the target while pending",
        dict(step="pending"),
        dict(version="v2", routed=False),
        None,
        "Rolling",
        "loaded",
        [Resume(W)],
        {},
    ),
    (
        "…but a closed barrier freezes it with the rest",
        dict(step="pending"),
        dict(version="v2", routed=False),
        None,
        "Barrier",
        "pending",
        [],
        {},
    ),
    (
        "done stays done",
        dict(step="resumed"),
        dict(version="v2", routed=False),
        None,
        "Rolling",
        "resumed",
        [],
        {},
    ),
    (
        "unready but not failed yet: wait",
        dict(step="frozen", frozen_at=95.0),
        dict(ready=False, in_flight=1, **FROZEN),
        None,
        "Rolling",
        "frozen",
        [],
        {},
    ),
]


@pytest.mark.parametrize(
    ("progress", "fields", "failure", "strategy", "step", "actions", "checks"),
    [case[1:] for case in STEPS],
    ids=[case[0] for case in STEPS],
)
def test_advance(
    fleet: Any,
    worker: Any,
    progress: dict[str, Any],
    fields: dict[str, Any] | None,
    failure: str | None,
    strategy: str,
    step: str,
    actions: list[Any],
    checks: dict[str, Any],
) -> None:
    ctx = _ctx(fleet, strategy.split()[0], released=strategy.endswith("released"))
    p = WorkerProgress(W, **progress)
    w = None
    if fields is not None:
        fields = dict(fields)
        w = worker("decode", 0, fields.pop("version", "v1"), last_seen=NOW, **fields)
    new, acts = advance(p, w, failure, ctx)
    assert new.step == step
    assert acts == actions
    for key, value in checks.items():
        assert getattr(new, key) == value
    if step == "failed":
        assert new.reason.split(":")[0] in ("Died", "LoadTimeout")


def test_no_record_and_every_worker_on_target_means_in_sync(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 2})
    obs = FleetObservation((worker("decode", 0, "v2"), worker("decode", 1, "v2")), NOW)
    plan = plan_sync(desired, obs, None)
    assert (plan.record, plan.syncing, plan.reason, plan.actions) == (None, False, "InSync", ())


def test_a_new_target_opens_a_record_and_freezes_the_first_worker(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 2})
    obs = FleetObservation((worker("decode", 0, "v1"), worker("decode", 1, "v1")), NOW)
    plan = plan_sync(desired, obs, None)
    assert plan.actions == (Freeze("dep-decode-0"),)
    assert plan.record is not None and plan.record.target_version == "v2"
    assert [(p.name, p.step) for p in plan.record.workers] == [
        ("dep-decode-0", "frozen"),
        ("dep-decode-1", "pending"),
    ]
    assert plan.record.get("dep-decode-0").taken == "safe"  # type: ignore[union-attr]
    assert (plan.syncing, plan.reason, plan.wake_at) == (True, "Rolling", NOW + 10.0)
    assert "0/2 workers done" in plan.message and "dep-decode-0 draining" in plan.message
    assert holds(plan.record, "dep-decode-0") and not holds(plan.record, "dep-decode-1")


def test_a_load_timeout_halts_the_sync_and_says_where(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 3}, mu=2)
    record = SyncRecord(
        "v2",
        desired.source_uri,
        "Rolling",
        0.0,
        (
            WorkerProgress("dep-decode-0", "failed", reason="LoadTimeout: dep-decode-0 did not"),
            WorkerProgress("dep-decode-1", "pending"),
            WorkerProgress("dep-decode-2", "pending"),
        ),
    )
    obs = FleetObservation(
        (
            worker("decode", 0, "v1", **FROZEN),
            worker("decode", 1, "v1"),
            worker("decode", 2, "v1"),
        ),
        NOW,
    )
    plan = plan_sync(desired, obs, record)
    assert plan.actions == ()
    assert plan.reason == "LoadTimeout"
    assert "dep-decode-0 failed (LoadTimeout" in plan.message
    assert "check the worker's log and the source uri" in plan.message


def test_a_new_target_mid_sync_carries_the_drain_over(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 2}, version="v3")
    old = SyncRecord(
        "v2",
        "file:///models/v2",
        "Rolling",
        0.0,
        (
            WorkerProgress(
                "dep-decode-0", "drained", since=90.0, frozen_at=80.0, loads=1, taken="safe"
            ),
            WorkerProgress("dep-decode-1", "pending"),
        ),
    )
    loading = worker("decode", 0, "v1", loading=True, **FROZEN)
    obs = FleetObservation((loading, worker("decode", 1, "v1")), NOW)
    plan = plan_sync(desired, obs, old)
    assert plan.record is not None and plan.record.target_version == "v3"
    p0 = plan.record.get("dep-decode-0")
    assert p0 is not None and (p0.step, p0.frozen_at, p0.loads) == ("drained", 80.0, 0)
    assert plan.actions == ()  # one out already (mu 1), and its v2 load must end first
    done = replace(loading, loading=False, weights_version="v2")
    plan = plan_sync(
        desired, FleetObservation((done, worker("decode", 1, "v1")), NOW + 1), plan.record
    )
    assert plan.actions == (LoadWeights("dep-decode-0", "file:///models/v3", "v3"),)


def test_barrier_releases_only_when_every_healthy_worker_is_loaded(fleet: Any, worker: Any) -> None:
    desired = fleet({"prefill": 1, "decode": 2}, strategy="Barrier")
    record = SyncRecord(
        "v2",
        desired.source_uri,
        "Barrier",
        0.0,
        (
            WorkerProgress("dep-prefill-0", "loaded"),
            WorkerProgress("dep-decode-0", "drained", since=NOW, loads=1),
            WorkerProgress("dep-decode-1", "frozen", frozen_at=NOW),
        ),
    )
    p0 = worker("prefill", 0, "v2", **FROZEN)
    d0 = worker("decode", 0, "v1", loading=True, **FROZEN)
    dead = worker("decode", 1, "v1", alive=False, ready=False, **FROZEN)
    plan = plan_sync(desired, FleetObservation((p0, d0, dead), NOW), record)
    assert plan.actions == () and plan.record is not None and plan.record.released_at is None
    d0 = replace(d0, loading=False, weights_version="v2")
    plan = plan_sync(desired, FleetObservation((p0, d0, dead), NOW + 1), plan.record)
    # the dead worker does not hold the barrier: failover restarts it on v2
    assert set(plan.actions) == {Resume("dep-prefill-0"), Resume("dep-decode-0")}
    assert plan.record is not None and plan.record.released_at == NOW + 1
    assert plan.record.get("dep-decode-1").step == "failed"  # type: ignore[union-attr]


def test_the_sync_finishes_when_every_worker_serves_the_target(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 1})
    record = SyncRecord(
        "v2", desired.source_uri, "Rolling", 0.0, (WorkerProgress("dep-decode-0", "loaded"),)
    )
    plan = plan_sync(desired, FleetObservation((worker("decode", 0, "v2"),), NOW), record)
    assert plan.record is not None and plan.record.finished_at == NOW
    assert (plan.syncing, plan.reason) == (False, "InSync")
    assert not holds(plan.record, "dep-decode-0")


def test_a_worker_added_mid_sync_joins_the_record(fleet: Any, worker: Any) -> None:
    desired = fleet({"decode": 2})
    record = SyncRecord(
        "v2",
        desired.source_uri,
        "Rolling",
        0.0,
        (WorkerProgress("dep-decode-0", "frozen", frozen_at=NOW),),
    )
    obs = FleetObservation(
        (worker("decode", 0, "v1", in_flight=1, **FROZEN), worker("decode", 1, "v2")), NOW
    )
    plan = plan_sync(desired, obs, record)
    assert plan.record is not None
    assert plan.record.get("dep-decode-1").step == "resumed"  # type: ignore[union-attr]
