"""One simulated prefill or decode worker: its queue, its batch, what it has measured (the same
TTFT and ITL histograms a real worker exports) and the Status it would answer.

Owns a worker's state between events; never routes, never decides replicas, never reads a clock
(every call is given the simulated time).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from bench.autoscale_sim.service import ServiceModel
from bench.autoscale_sim.trace import Request

from loom_operator.api.roles import RoleName
from loom_operator.control.role_metrics import Buckets
from loom_runtime.control_api.status import WorkerStatus

INF = float("inf")


@dataclass
class Histogram:
    """A cumulative-on-read histogram with fixed bounds (+Inf added), counts may be fractional."""

    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counts = [0.0] * (len(self.bounds) + 1)

    def observe(self, value: float, n: float = 1.0) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n

    def buckets(self) -> Buckets:
        total, out = 0.0, []
        for le, n in zip((*self.bounds, INF), self.counts, strict=True):
            total += n
            out.append((le, total))
        return tuple(out)


@dataclass
class Worker:
    name: str
    role: RoleName
    launched_s: float
    ready_s: float
    """When it starts serving (launch plus the start delay)."""
    retiring: bool = False
    stopped_s: float | None = None

    def serving(self, now: float) -> bool:
        return self.stopped_s is None and now >= self.ready_s

    def routable(self, now: float) -> bool:
        return self.serving(now) and not self.retiring


@dataclass
class Prefilling:
    request: Request
    left: int


@dataclass
class PrefillWorker(Worker):
    """FCFS chunked prefill: each forward takes prompt tokens up to the budget."""

    queue: deque[Prefilling] = field(default_factory=deque)
    step: list[Prefilling] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    busy_until: float | None = None
    ttft: Histogram | None = None
    arrived_tokens: int = 0
    """Prompt tokens of the requests routed to it (`loom:prompt_tokens_arrived`)."""

    def take(self, r: Request) -> None:
        """A request arrives: queued, its prompt counted."""
        self.queue.append(Prefilling(r, r.prompt_tokens))
        self.arrived_tokens += r.prompt_tokens

    def backlog_tokens(self) -> int:
        return sum(p.left for p in self.queue) + sum(p.left for p in self.step)

    def start_step(self, now: float, model: ServiceModel) -> float | None:
        """Takes the next forward's prompt tokens off the queue; when it ends (None: idle)."""
        budget = model.prefill_budget
        self.step, self.step_tokens = [], []
        while self.queue and budget > 0:
            head = self.queue[0]
            take = min(head.left, budget)
            budget -= take
            self.step.append(self.queue.popleft())
            self.step_tokens.append(take)
        if not self.step:
            self.busy_until = None
            return None
        self.busy_until = now + model.prefill_s(sum(self.step_tokens))
        return self.busy_until

    def end_step(self) -> list[Request]:
        """The prompts the forward completed (the rest of a chunked one goes back first)."""
        done = []
        for p, took in zip(self.step, self.step_tokens, strict=True):
            p.left -= took
            if p.left == 0:
                done.append(p.request)
            else:
                self.queue.appendleft(p)
        self.step, self.step_tokens = [], []
        self.busy_until = None
        return done

    def in_flight(self) -> int:
        return len(self.queue) + len(self.step)

    def status(self) -> WorkerStatus:
        running = len(self.step)
        return _status(self, in_flight=self.in_flight(), running=running,
                       waiting=self.in_flight() - running, kv=0.0)  # fmt: skip


@dataclass
class Decoding:
    request: Request
    admitted_s: float
    v_start: float
    """The worker's token clock when it joined; it finishes at v_start + output - 1."""


@dataclass
class DecodeWorker(Worker):
    """Continuous batching as a fluid: every running sequence gains one token per step, and a
    step lasts `decode_s(batch)`; admissions and finishes change the batch between steps."""

    running: list[Decoding] = field(default_factory=list)
    waiting: deque[Request] = field(default_factory=deque)
    v: float = 0.0
    """Tokens each running sequence has gained since the worker started (its token clock)."""
    at: float = 0.0
    version: int = 0
    """Bumped whenever the next finish moves (a stale finish event is ignored)."""
    itl: Histogram | None = None
    generated: float = 0.0
    """Tokens generated (`vllm:generation_tokens`)."""

    def advance(self, now: float, model: ServiceModel) -> None:
        """Moves the token clock to `now`, observing each token's gap."""
        b = len(self.running)
        if b and now > self.at:
            step = model.decode_s(b)
            tokens = (now - self.at) / step
            self.v += tokens
            self.generated += b * tokens
            if self.itl is not None:
                self.itl.observe(step, b * tokens)
        self.at = now

    def admit(self, now: float, model: ServiceModel) -> list[Decoding]:
        """Moves waiting requests into the batch while a slot and their KV fit."""
        joined = []
        while self.waiting and len(self.running) < model.max_num_seqs:
            r = self.waiting[0]
            if self.kv_reserved() + r.prompt_tokens + r.output_tokens > model.kv_tokens:
                break
            self.waiting.popleft()
            d = Decoding(r, now, self.v)
            self.running.append(d)
            joined.append(d)
        return joined

    def finished(self) -> list[Decoding]:
        done = [d for d in self.running if self.v >= d.v_start + d.request.output_tokens - 1 - 1e-9]
        self.running = [d for d in self.running if d not in done]
        return done

    def next_finish(self, model: ServiceModel) -> float | None:
        if not self.running:
            return None
        v_end = min(d.v_start + d.request.output_tokens - 1 for d in self.running)
        return self.at + max(0.0, v_end - self.v) * model.decode_s(len(self.running))

    def kv_reserved(self) -> int:
        return sum(d.request.prompt_tokens + d.request.output_tokens for d in self.running)

    def kv_used(self, model: ServiceModel) -> float:
        used = sum(d.request.prompt_tokens + (self.v - d.v_start) for d in self.running)
        return min(1.0, used / model.kv_tokens)

    def status(self, model: ServiceModel) -> WorkerStatus:
        running = len(self.running)
        return _status(self, in_flight=running + len(self.waiting), running=running,
                       waiting=len(self.waiting), kv=self.kv_used(model))  # fmt: skip


def _status(w: Worker, *, in_flight: int, running: int, waiting: int, kv: float) -> WorkerStatus:
    return WorkerStatus(
        model_name="sim", role=w.role, weights_version="v1",
        state="draining" if w.retiring else "serving", admission_open=not w.retiring,
        in_flight=in_flight, num_running=running, num_waiting=waiting, kv_usage=kv,
        num_blocks=0, num_free_blocks=0, block_size=16,
    )  # fmt: skip
