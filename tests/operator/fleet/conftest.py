"""Builders for the fleet-controller tests: desired fleets and worker states as plain data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from loom_operator.fleet.desired import (
    DesiredFleet,
    FailoverPolicy,
    RoleTarget,
    SyncPolicy,
    worker_name,
)
from loom_operator.fleet.observed import WorkerState

FleetFactory = Callable[..., DesiredFleet]
WorkerFactory = Callable[..., WorkerState]

DEPLOYMENT = "dep"


def make_fleet(
    roles: dict[str, int] | None = None,
    version: str = "v2",
    strategy: str = "Rolling",
    mu: int = 1,
    drain_s: float = 10.0,
    load_s: float = 50.0,
    **failover: Any,
) -> DesiredFleet:
    """A DesiredFleet `dep` (default 1 prefill + 1 decode) with fast test timings."""
    fo = {
        "health_timeout_s": 2.0,
        "startup_timeout_s": 30.0,
        "backoff_base_s": 1.0,
        "backoff_cap_s": 8.0,
        "crash_loop_failures": 5,
        "crash_loop_window_s": 60.0,
    }
    fo.update(failover)
    return DesiredFleet(
        deployment=DEPLOYMENT,
        component="decoder",
        weights_version=version,
        source_uri=f"file:///models/{version}",
        roles=tuple(
            RoleTarget(r, n)  # type: ignore[arg-type]
            for r, n in (roles or {"prefill": 1, "decode": 1}).items()
        ),
        sync=SyncPolicy(
            strategy=strategy,  # type: ignore[arg-type]
            max_unavailable=mu,
            drain_timeout_s=drain_s,
            load_timeout_s=load_s,
        ),
        failover=FailoverPolicy(**fo),
    )


def make_worker(
    role: str = "decode", index: int = 0, version: str | None = "v1", **kw: Any
) -> WorkerState:
    """A healthy, routed worker `dep-<role>-<index>` on `version`, started at 0, seen at 0."""
    fields: dict[str, Any] = {"started_at": 0.0, "last_seen": 0.0, "address": f"10.0.0.{index}"}
    fields.update(kw)
    name = worker_name(DEPLOYMENT, role, index)  # type: ignore[arg-type]
    return WorkerState(name=name, role=role, weights_version=version, **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def fleet() -> FleetFactory:
    """fleet(roles={"prefill": 2, "decode": 2}, version="v2", strategy="Barrier", mu=2)."""
    return make_fleet


@pytest.fixture(scope="session")
def worker() -> WorkerFactory:
    """worker("prefill", 1, "v1", in_flight=3, routed=False) -> WorkerState dep-prefill-1."""
    return make_worker
