"""FleetSimulator: a pure in-test simulator of a fleet's workers and router, standing in for the
substrates (processes, pods) under the fleet controller in tests/operator/fleet/test_simulation.py.

Owns the simulated workers' states and how actions and time change them; checks nothing about
the controller (the tests do), except that LoadWeights reaches only a frozen, idle worker (a
keep swap's, with `kv`, only a serving one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from loom_operator.fleet.actions import (
    Action,
    Freeze,
    LoadWeights,
    MigrateRequests,
    RestartWorker,
    Resume,
    RouteOff,
    RouteOn,
    SetCondition,
    StartWorker,
    StopWorker,
)
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.observed import FleetObservation, WorkerState

MAX_REQUESTS = 3  # in flight per routable worker in the simulator's steady traffic


@dataclass
class FleetSimulator:
    """A pure in-test simulator of a fleet: workers with steady traffic, drains, weight loads,
    crashes and restarts, and a router that honours RouteOn/RouteOff/Freeze. A test double for
    the substrates; it applies the controller's actions and moves time by one tick per step."""

    workers: dict[str, WorkerState]
    now: float = 0.0
    load_ticks: int = 2
    start_ticks: int = 2
    stuck: frozenset[str] = frozenset()
    """Workers whose requests never finish by themselves (their drain needs the timeout)."""
    loads: Counter[tuple[str, str]] = field(default_factory=Counter)
    migrated: int = 0
    lost: int = 0
    hung: set[str] = field(default_factory=set)
    _loading: dict[str, tuple[str, int]] = field(default_factory=dict)
    _starting: dict[str, int] = field(default_factory=dict)

    def observe(self) -> FleetObservation:
        return FleetObservation(tuple(self.workers.values()), self.now)

    def _set(self, name: str, **kw: Any) -> None:
        self.workers[name] = replace(self.workers[name], **kw)

    def _fresh(self, name: str, role: str, version: str, restarts: int, routed: bool) -> None:
        old = self.workers.get(name)
        self.workers[name] = WorkerState(
            name=name,
            role=role,  # type: ignore[arg-type]
            weights_version=version,
            ready=False,
            routed=routed,
            restarts=restarts,
            started_at=self.now,
            last_exit_at=old.last_exit_at if old else None,
        )
        self._loading.pop(name, None)
        self.hung.discard(name)
        self._starting[name] = self.start_ticks

    def apply(self, actions: Iterable[Action]) -> None:
        for a in actions:
            if isinstance(a, SetCondition):
                continue
            w = self.workers.get(a.worker)
            if isinstance(a, StartWorker):
                if w is None:
                    self._fresh(a.worker, a.role, a.version, 0, routed=False)
                continue
            assert w is not None, f"{a} names a worker that does not exist"
            self._apply_one(a, w)

    def _apply_one(self, a: Action, w: WorkerState) -> None:
        if isinstance(a, Freeze):
            self._set(w.name, routed=False, admission_open=False)
        elif isinstance(a, RouteOff):
            self._set(w.name, routed=False)
        elif isinstance(a, RouteOn):
            self._set(w.name, routed=True)
        elif isinstance(a, Resume) and w.alive:
            self._set(w.name, routed=True, admission_open=True)
        elif isinstance(a, MigrateRequests):
            self.migrated += w.busy
            self._set(w.name, in_flight=0, pending_kv_pulls=0)
        elif isinstance(a, LoadWeights) and a.kv:  # a keep swap: under its running requests
            assert w.alive and w.admission_open and not w.loading, (
                f"a keep LoadWeights reached {w.name}, which is not serving"
            )
            self.loads[(w.name, a.version)] += 1
            self._loading[w.name] = (a.version, self.load_ticks)
            self._set(w.name, loading=True)
        elif isinstance(a, LoadWeights):
            assert w.alive and w.frozen and w.busy == 0 and not w.loading, (
                f"LoadWeights reached {w.name} while routed={w.routed} "
                f"admitting={w.admission_open} busy={w.busy} loading={w.loading}"
            )
            self.loads[(w.name, a.version)] += 1
            self._loading[w.name] = (a.version, self.load_ticks)
            self._set(w.name, loading=True)
        elif isinstance(a, RestartWorker):
            self._fresh(w.name, a.role, a.version, w.restarts + 1, routed=w.routed)
        elif isinstance(a, StopWorker):
            assert not w.routed, f"StopWorker reached {w.name} while the router sends to it"
            self.migrated += w.busy
            del self.workers[w.name]

    def crash(self, name: str) -> None:
        w = self.workers.get(name)
        if w is None or not w.alive:
            return
        self.migrated += w.busy  # the router replays them elsewhere
        self._loading.pop(name, None)
        self._starting.pop(name, None)
        self._set(
            name,
            alive=False,
            ready=False,
            in_flight=0,
            pending_kv_pulls=0,
            loading=False,
            last_exit_at=self.now,
        )

    def hang(self, name: str) -> None:
        """The worker stops answering its probe but keeps running (and holding requests)."""
        w = self.workers.get(name)
        if w is not None and w.alive:
            self._starting.pop(name, None)
            self._set(name, ready=False)
            self.hung.add(name)

    def step(self) -> None:
        """One tick: traffic arrives at routable workers, frozen ones drain, loads and starts
        progress."""
        self.now += 1.0
        for name, w in list(self.workers.items()):
            if not w.alive:
                continue
            if w.routable:
                pulls = 1 if w.role == "prefill" else 0
                self._set(
                    name, in_flight=min(MAX_REQUESTS, w.in_flight + 1), pending_kv_pulls=pulls
                )
            elif not w.admission_open and name not in self.stuck:
                self._set(name, in_flight=max(0, w.in_flight - 1), pending_kv_pulls=0)
            if name in self._loading:
                version, left = self._loading[name]
                if left <= 1:
                    del self._loading[name]
                    self._set(name, weights_version=version, loading=False)
                else:
                    self._loading[name] = (version, left - 1)
            if name in self._starting:
                self._starting[name] -= 1
                if self._starting[name] <= 0:
                    del self._starting[name]
                    self._set(name, ready=True)
            if self.workers[name].ready and name not in self.hung:
                self._set(name, last_seen=self.now)


def v1_fleet(desired: DesiredFleet, version: str = "v1") -> dict[str, WorkerState]:
    """Every desired worker up, routed and serving `version`, with requests in flight."""
    return {
        s.name: WorkerState(
            name=s.name,
            role=s.role,
            weights_version=version,
            in_flight=2,
            started_at=0.0,
            last_seen=0.0,
        )
        for s in desired.slots
    }
