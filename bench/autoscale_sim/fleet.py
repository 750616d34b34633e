"""The event loop: requests arrive per the trace, queue at a prefill worker, are prefilled in
chunked forwards, handed to the least busy decode worker, decoded with continuous batching, and
finish; every `policy.every_s` the policy sets each role's replicas. A new worker serves after
the start delay; a retired one takes nothing new and leaves when empty (a drain, never a kill).

Owns the simulated clock, the workers and the per-request outcomes; decides nothing itself.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.autoscale_sim.policies import Policy, Snapshot
from bench.autoscale_sim.service import ServiceModel
from bench.autoscale_sim.trace import Request
from bench.autoscale_sim.workers import DecodeWorker, Histogram, PrefillWorker, Worker

from loom_operator.api.roles import RoleName
from loom_operator.control.role_metrics import WorkerSample
from loom_operator.fleet.observed import WorkerState
from loom_runtime.control_api.status import WorkerStatus
from loom_runtime.serve.metrics import ITL_BUCKETS, TTFT_BUCKETS

ROLES: tuple[RoleName, ...] = ("prefill", "decode")


@dataclass(frozen=True)
class Outcome:
    request: Request
    ttft_s: float
    """Arrival to the first token at the client (the decode worker taking it into its batch)."""
    itl_s: float
    """The request's mean gap between tokens (0 for a one-token answer)."""
    finish_s: float


@dataclass
class RunResult:
    policy: str
    outcomes: list[Outcome]
    replica_seconds: dict[RoleName, float]
    end_s: float
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, prefill replicas asked, decode replicas asked) at each change."""


class Fleet:
    def __init__(self, model: ServiceModel, policy: Policy, initial: Mapping[RoleName, int]):
        self.model, self.policy = model, policy
        self.now = 0.0
        self.workers: list[Worker] = []
        self.asked: dict[RoleName, int] = dict(initial)
        self.held: dict[RoleName, list[Request]] = {"prefill": [], "decode": []}
        self.outcomes: list[Outcome] = []
        self.timeline: list[tuple[float, int, int]] = []
        self._events: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._names = itertools.count()
        for role, n in initial.items():
            for _ in range(n):
                self._launch(role, ready_s=0.0)

    def run(self, requests: list[Request]) -> RunResult:
        for r in requests:
            self._push(r.arrival_s, "arrive", r)
        self._push(0.0, "tick", None)
        self._record()
        while self._events:
            self.now, _, kind, what = heapq.heappop(self._events)
            if kind == "tick" and len(self.outcomes) == len(requests):
                break
            getattr(self, "_on_" + kind)(what)
        # the run ends with its last answer (not at the policy's next round)
        end = max((o.finish_s for o in self.outcomes), default=self.now)
        seconds: dict[RoleName, float] = {r: 0.0 for r in ROLES}
        for w in self.workers:
            stop = min(end, w.stopped_s if w.stopped_s is not None else end)
            seconds[w.role] += max(0.0, stop - w.launched_s)
        return RunResult(self.policy.name, self.outcomes, seconds, end, self.timeline)

    # events

    def _on_arrive(self, r: Request) -> None:
        self._to_prefill(r)

    def _on_prefill_end(self, w: PrefillWorker) -> None:
        for r in w.end_step():
            assert w.ttft is not None
            w.ttft.observe(self.now - r.arrival_s)  # what the prefill worker measures
            self._push(self.now + self.model.handoff_s, "handoff", r)
        self._prefill_next(w)

    def _on_handoff(self, r: Request) -> None:
        self._to_decode(r)

    def _on_decode_end(self, what: tuple[DecodeWorker, int]) -> None:
        w, version = what
        if version != w.version:
            return
        w.advance(self.now, self.model)
        for d in w.finished():
            gaps = d.request.output_tokens - 1
            itl = (self.now - d.admitted_s) / gaps if gaps else 0.0
            self.outcomes.append(
                Outcome(d.request, d.admitted_s - d.request.arrival_s, itl, self.now)
            )
        self._decode_admit(w)

    def _on_ready(self, w: Worker) -> None:
        if w.stopped_s is None and not w.retiring:
            for r in self.held[w.role]:
                (self._to_prefill if w.role == "prefill" else self._to_decode)(r)
            self.held[w.role] = []

    def _on_tick(self, _: None) -> None:
        wanted = self.policy.decide(self._snapshot())
        for role, n in wanted.items():
            self._scale(role, n)
        self._push(self.now + self.policy.every_s, "tick", None)

    # routing and serving

    def _to_prefill(self, r: Request) -> None:
        ready = [w for w in self._mine("prefill") if w.routable(self.now)]
        prefills = [w for w in ready if isinstance(w, PrefillWorker)]
        if not prefills:
            self.held["prefill"].append(r)
            return
        w = min(prefills, key=lambda w: w.backlog_tokens())  # the least prompt work queued
        w.take(r)
        if w.busy_until is None:
            self._prefill_next(w)

    def _prefill_next(self, w: PrefillWorker) -> None:
        end = w.start_step(self.now, self.model)
        if end is not None:
            self._push(end, "prefill_end", w)
        elif w.retiring:
            self._stop(w)

    def _to_decode(self, r: Request) -> None:
        ready = [w for w in self._mine("decode") if w.routable(self.now)]
        decodes = [w for w in ready if isinstance(w, DecodeWorker)]
        if not decodes:
            self.held["decode"].append(r)
            return
        w = min(decodes, key=lambda w: len(w.running) + len(w.waiting))  # the least busy
        w.advance(self.now, self.model)
        w.waiting.append(r)
        self._decode_admit(w)

    def _decode_admit(self, w: DecodeWorker) -> None:
        w.admit(self.now, self.model)
        w.version += 1
        end = w.next_finish(self.model)
        if end is not None:
            self._push(end, "decode_end", (w, w.version))
        elif w.retiring and not w.waiting:
            self._stop(w)

    # replicas

    def _scale(self, role: RoleName, n: int) -> None:
        if n != self.asked.get(role):
            self.asked[role] = n
            self._record()
        active = [w for w in self._mine(role) if not w.retiring]
        if n > len(active):
            for w in [w for w in self._mine(role) if w.retiring][: n - len(active)]:
                w.retiring = False  # routed back on instead of stopped
                active.append(w)
                if w.serving(self.now):
                    self._on_ready(w)
            for _ in range(n - len(active)):
                self._launch(role, ready_s=self.now + self.model.start_s)
        for w in sorted(active, key=lambda w: int(w.name.rsplit("-", 1)[1]))[n:]:
            w.retiring = True
            if not w.serving(self.now) or self._idle(w):
                self._stop(w)

    def _launch(self, role: RoleName, ready_s: float) -> None:
        name = f"{role}-{next(self._names)}"
        w: Worker
        if role == "prefill":
            w = PrefillWorker(name, role, self.now, ready_s, ttft=Histogram(TTFT_BUCKETS))
        else:
            w = DecodeWorker(name, role, self.now, ready_s, at=ready_s, itl=Histogram(ITL_BUCKETS))
        self.workers.append(w)
        if ready_s > self.now:
            self._push(ready_s, "ready", w)

    def _idle(self, w: Worker) -> bool:
        if isinstance(w, PrefillWorker):
            return w.in_flight() == 0
        assert isinstance(w, DecodeWorker)
        return not w.running and not w.waiting

    def _stop(self, w: Worker) -> None:
        w.stopped_s = self.now

    # observation

    def _snapshot(self) -> Snapshot:
        states: list[WorkerState] = []
        statuses: dict[str, WorkerStatus | None] = {}
        scrapes: dict[str, WorkerSample] = {}
        for w in self.workers:
            if w.stopped_s is not None:
                continue
            serving = w.serving(self.now)
            busy = self._busy(w)
            states.append(WorkerState(
                w.name, w.role, "v1", ready=serving, admission_open=not w.retiring,
                routed=not w.retiring, in_flight=busy, started_at=w.launched_s,
            ))  # fmt: skip
            if not serving:
                statuses[w.name] = None
                continue
            if isinstance(w, PrefillWorker):
                assert w.ttft is not None
                statuses[w.name] = w.status()
                scrapes[w.name] = WorkerSample(
                    self.now, w.ttft.buckets(), (), w.backlog_tokens(), w.arrived_tokens
                )
            else:
                assert isinstance(w, DecodeWorker) and w.itl is not None
                w.advance(self.now, self.model)
                statuses[w.name] = w.status(self.model)
                scrapes[w.name] = WorkerSample(
                    self.now, (), w.itl.buckets(), 0.0, generation_tokens=w.generated
                )
        return Snapshot(self.now, dict(self.asked), tuple(states), statuses, scrapes)

    def _busy(self, w: Worker) -> int:
        if isinstance(w, PrefillWorker):
            return w.in_flight()
        assert isinstance(w, DecodeWorker)
        return len(w.running) + len(w.waiting)

    def _mine(self, role: RoleName) -> list[Worker]:
        return [w for w in self.workers if w.role == role and w.stopped_s is None]

    def _record(self) -> None:
        self.timeline.append((self.now, self.asked.get("prefill", 0), self.asked.get("decode", 0)))

    def _push(self, at: float, kind: str, what: Any) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, what))
