"""The Keep sync (a push in mode keep) against the simulated fleet: every worker is sent
LoadWeights with the push's kv policy at once while it serves — none frozen, drained or migrated —
and each is resumed once on the pushed version (the router learns it); the sync ends with every
worker on it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.operator.fleet.fleet_simulator import FleetSimulator, v1_fleet

from loom_operator.fleet.actions import Freeze, LoadWeights, MigrateRequests, Resume
from loom_operator.fleet.controller import reconcile
from loom_operator.fleet.record import FleetRecord


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_keep_sync_loads_every_worker_under_its_requests(fleet: Any, kv: str) -> None:
    desired = fleet({"aggregated": 3}, strategy="Keep")
    desired = replace(desired, sync=replace(desired.sync, kv=kv))
    sim = FleetSimulator(v1_fleet(desired))
    record = FleetRecord()
    loads: list[LoadWeights] = []
    resumed: list[str] = []
    for _ in range(60):
        rec = reconcile(desired, sim.observe(), record)
        record = rec.record
        sim.apply(rec.actions)
        assert not [a for a in rec.actions if isinstance(a, Freeze | MigrateRequests)]
        loads += [a for a in rec.actions if isinstance(a, LoadWeights)]
        resumed += [a.worker for a in rec.actions if isinstance(a, Resume)]
        if rec.condition("WeightSyncing").status == "False":
            break
        sim.step()
    assert rec.condition("WeightSyncing").reason == "InSync"
    assert sorted(a.worker for a in loads) == [f"dep-aggregated-{i}" for i in range(3)]
    assert {a.kv for a in loads} == {kv} and {a.source for a in loads} == {desired.source_uri}
    assert {w.weights_version for w in sim.workers.values()} == {"v2"}
    assert sim.migrated == 0 and sim.lost == 0
    # each is resumed once on the new version: the router learns the version it now serves
    assert sorted(resumed) == sorted(a.worker for a in loads)
