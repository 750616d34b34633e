"""A new weight-sync strategy is one module plus its registration: `Serial`, defined only here
and registered for the test, drives the whole pure fleet core (reconcile → plan_sync) through a
sync against the simulated fleet, with no other file knowing its name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from tests.operator.fleet.fleet_simulator import FleetSimulator, v1_fleet

from loom_operator.fleet.actions import Freeze
from loom_operator.fleet.controller import reconcile
from loom_operator.fleet.desired import SyncPolicy
from loom_operator.fleet.record import HELD_STEPS, FleetRecord
from loom_operator.fleet.strategies import registry
from loom_operator.fleet.strategies.contract import SyncChoice, SyncRound


@dataclass(frozen=True)
class Serial:
    """One worker at a time, last slot first, whatever maxUnavailable says."""

    name: str = "Serial"
    mixes_versions: bool = True
    keeps_running: bool = False

    def choose(self, now: SyncRound) -> SyncChoice:
        if any(p.step in HELD_STEPS for p in now.progress.values()):
            return SyncChoice()
        off = [w for w in now.pending if w.routable and w.weights_version != now.target]
        return SyncChoice((off[-1].name,), "safe") if off else SyncChoice()

    def summary(self, policy: SyncPolicy) -> str:
        return f"{self.name}, last slot first"


@pytest.fixture
def serial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.STRATEGIES, "Serial", Serial())  # type: ignore[index]


@pytest.mark.usefixtures("serial")
def test_a_strategy_registered_from_its_own_module_drives_a_whole_sync(fleet: Any) -> None:
    desired = fleet({"decode": 3}, mu=3, strategy="Serial")
    sim = FleetSimulator(v1_fleet(desired))
    record = FleetRecord()
    frozen: list[str] = []
    for _ in range(60):
        rec = reconcile(desired, sim.observe(), record)
        record = rec.record
        sim.apply(rec.actions)
        frozen += [a.worker for a in rec.actions if isinstance(a, Freeze)]
        syncing = rec.condition("WeightSyncing")
        if syncing.status == "False":
            break
        assert record.sync is not None and record.sync.strategy == "Serial"
        assert len(record.sync.held()) <= 1  # Serial's rule, not maxUnavailable 3
        assert syncing.reason == "Serial" and "(Serial, last slot first)" in syncing.message
        assert rec.condition("Ready").status == "True"  # it mixes versions: two always serve
        sim.step()
    assert syncing.reason == "InSync"
    assert list(dict.fromkeys(frozen)) == ["dep-decode-2", "dep-decode-1", "dep-decode-0"]
    assert {w.weights_version for w in sim.workers.values()} == {"v2"}
    assert sorted(sim.loads.values()) == [1, 1, 1] and sim.lost == 0
