"""The ways the bench moves the fleet: Loom's planner (the real `plan_autoscale`, fed by the
real `role_signals` as the operator's shell feeds it), fixed fleets, a queue-depth threshold
scaler (KEDA's ScaledObject on `vllm:num_requests_waiting` driving an HPA), and two oracles that
read the trace's offered load (bounds on what scaling can reach, not scalers anyone can run).

Each policy is a small object deciding from a `Snapshot`; none touches a worker.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from loom_operator.api.roles import RoleName
from loom_operator.control.role_metrics import WorkerSample, role_signals
from loom_operator.fleet.autoscale import (
    TOLERANCE,
    AutoscalePlan,
    AutoscalePolicy,
    Recommendation,
    plan_autoscale,
)
from loom_operator.fleet.observed import WorkerState
from loom_runtime.control_api.status import WorkerStatus


@dataclass(frozen=True)
class Snapshot:
    """What a scaler could observe of the fleet at one moment."""

    now: float
    replicas: Mapping[RoleName, int]
    """What each role is asked to run."""
    workers: tuple[WorkerState, ...]
    statuses: Mapping[str, WorkerStatus | None]
    scrapes: Mapping[str, WorkerSample]
    """Each serving worker's /metrics as `parse_sample` would read it."""


class Policy(Protocol):
    name: str
    every_s: float

    def decide(self, snap: Snapshot) -> dict[RoleName, int]: ...


@dataclass
class Fixed:
    name: str
    sizes: Mapping[RoleName, int]
    every_s: float = 60.0

    def decide(self, snap: Snapshot) -> dict[RoleName, int]:
        return dict(self.sizes)


@dataclass
class Planner:
    """Loom's planner as control/autoscaler.py runs it: every `every_s` one scrape of every
    worker (samples kept for the windows), `role_signals` per role, `plan_autoscale` (with the
    card's capacity, or without: the latency and queue pressures alone)."""

    policy: AutoscalePolicy
    every_s: float = 5.0
    window_s: float = 30.0
    rate_window_s: float = 5.0
    name: str = "planner"
    last: AutoscalePlan | None = None
    _history: Mapping[RoleName, tuple[Recommendation, ...]] = field(default_factory=dict)
    _samples: dict[str, deque[WorkerSample]] = field(default_factory=dict)

    def decide(self, snap: Snapshot) -> dict[RoleName, int]:
        for gone in set(self._samples) - set(snap.scrapes):
            del self._samples[gone]
        keep = int(max(self.window_s, self.rate_window_s) / self.every_s) + 2
        for name, sample in snap.scrapes.items():
            self._samples.setdefault(name, deque(maxlen=keep)).append(sample)
        signals = [
            role_signals(role, n, snap.workers, snap.statuses, self._samples, 0, snap.now,
                         self.window_s, self.rate_window_s)
            for role, n in snap.replicas.items()
            if role in self.policy.roles
        ]  # fmt: skip
        plan = plan_autoscale(self.policy, signals, self._history, snap.now)
        self._history = plan.history
        self.last = plan
        return {d.role: d.desired for d in plan.decisions}


@dataclass
class QueueThreshold:
    """KEDA's prometheus trigger `sum(vllm:num_requests_waiting{role})` with a threshold, as the
    HPA it drives applies it: desired = ceil(sum / threshold) outside a 10 % tolerance; up at
    most max(2x, +4) per sync, no up window; down the highest of the last 300 s (HPA defaults)."""

    bounds: Mapping[RoleName, tuple[int, int]]
    threshold: float = 4.0
    every_s: float = 15.0
    down_window_s: float = 300.0
    name: str = "queue-threshold"
    _recs: dict[RoleName, list[tuple[float, int]]] = field(default_factory=dict)

    def decide(self, snap: Snapshot) -> dict[RoleName, int]:
        out: dict[RoleName, int] = {}
        for role, current in snap.replicas.items():
            lo, hi = self.bounds[role]
            waiting = sum(
                s.num_waiting
                for w in snap.workers
                if w.role == role and (s := snap.statuses.get(w.name)) is not None
            )
            out[role] = self._one(role, current, waiting, snap.now, lo, hi)
        return out

    def _one(self, role: RoleName, current: int, waiting: int, now: float, lo: int, hi: int) -> int:
        ratio = waiting / (self.threshold * max(current, 1))
        raw = current if abs(ratio - 1) <= TOLERANCE else math.ceil(waiting / self.threshold)
        raw = max(lo, min(hi, raw))
        recs = [r for r in self._recs.get(role, []) if r[0] > now - self.down_window_s]
        recs.append((now, raw))
        self._recs[role] = recs
        if raw > current:
            return min(raw, max(2 * current, current + 4))
        return min(current, max(n for _, n in recs))


@dataclass
class Oracle:
    """Not a scaler anyone can run: each role asks for its offered work per `bin_s` of arrivals
    (`report.bin_needs`) times `headroom`, read from the trace itself, with the bin before it —
    the bin under way from the moment it starts (`lead_s` 0: the bin's whole work known from its
    first second, so a forecast of up to `bin_s`), the bin `lead_s` ahead (a perfect forecast
    one worker start ahead), or with a negative `lead_s` of one short bin the last complete bins
    (what measuring the arrivals can know, at once). Bounds the SLO attainment reachable at a
    given cost with workers that take the model's start delay."""

    name: str
    need: Mapping[RoleName, Sequence[float]]
    lead_s: float = 0.0
    headroom: float = 1.5
    bin_s: float = 30.0
    every_s: float = 5.0

    def decide(self, snap: Snapshot) -> dict[RoleName, int]:
        i = int((snap.now + self.lead_s) // self.bin_s)
        out: dict[RoleName, int] = {}
        for role, need in self.need.items():
            window = need[max(0, i - 1) : i + 1] or [0.0]  # the bin and the one before it
            out[role] = max(1, math.ceil(self.headroom * max(window) - 1e-9))
        return out
