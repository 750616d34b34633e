"""One step thread for several engines on one worker (an LLM engine and a diffusion engine):
each step goes to the engine with work whose next step would finish earliest in fair compute
time, so they interleave step by step under one currency — measured seconds — not counts.

Owns the shared condition and step thread, the per-engine time accounts and the predicted step
cost (an EWMA of measured steps); never decides what an engine's step contains (each engine's
own scheduler does). `choose` is the pure decision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loom_runtime.engine.step_thread import StepThread

logger = logging.getLogger(__name__)

EWMA_ALPHA = 0.2  # weight of the newest measured step in an engine's predicted step time


@dataclass(frozen=True)
class TenantView:
    """What the choice reads of one engine: its share and time so far, its next step's cost."""

    name: str
    share: float
    used_s: float
    predicted_s: float


def choose(candidates: Sequence[TenantView]) -> int:
    """The index of the engine to step: least virtual finish time (time used plus its predicted
    step, over its share), ties to the earlier one. Pure; `candidates` is not empty."""
    return min(
        range(len(candidates)),
        key=lambda i: (candidates[i].used_s + candidates[i].predicted_s) / candidates[i].share,
    )


def catch_up(used_s: float, share: float, others: Sequence[TenantView]) -> float:
    """The time account of an engine that had no work while `others` ran: moved up to the
    least virtual time among them, so an idle spell is not a credit to spend in a burst."""
    if not others:
        return used_s
    floor = min(o.used_s / o.share for o in others)
    return max(used_s, floor * share)


@dataclass
class _Tenant:
    name: str
    step: Callable[[], bool]
    has_work: Callable[[], bool]  # called with the shared condition held
    on_error: Callable[[], None]
    share: float
    used_s: float = 0.0
    predicted_s: float = 0.0
    steps: int = 0
    active: bool = False

    def view(self) -> TenantView:
        return TenantView(self.name, self.share, self.used_s, self.predicted_s)


def condition_for(shared_thread: SharedStepThread | None) -> threading.Condition:
    """The condition (and lock) an engine guards its state with: its own, or the shared step
    thread's (one for every engine on that thread)."""
    return (
        shared_thread.cond if shared_thread is not None else threading.Condition(threading.Lock())
    )


def step_thread_for(
    shared_thread: SharedStepThread | None,
    cond: threading.Condition,
    kind: str,
    name: str,
    step: Callable[[], bool],
    has_work: Callable[[], bool],
    on_error: Callable[[], None],
    idle_wait_s: float,
) -> StepThread:
    """The step thread an engine runs on: its own over `cond` (named loom-`kind`-`name`), or the
    shared step thread's, with the engine registered under `name`. Call it last in the engine's
    constructor: a running shared thread may step the engine at once."""
    if shared_thread is None:
        return StepThread(f"loom-{kind}-{name}", cond, step, has_work, on_error, idle_wait_s)
    shared_thread.add(name, step, has_work, on_error)
    return shared_thread.thread


@dataclass(frozen=True)
class TenantStats:
    name: str
    share: float
    steps: int
    compute_s: float
    predicted_step_s: float


@dataclass
class SharedStepThread:
    """Build it first, pass it to each engine (which registers itself and then shares `cond` and
    `thread`), then `start()` once. Thread-safe."""

    name: str = "loom-worker"
    idle_wait_s: float = 0.5
    shares: dict[str, float] = field(default_factory=dict)
    """Relative compute shares by engine name (default 1 each)."""

    def __post_init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.thread = StepThread(
            self.name, self.cond, self.step, self._has_work, self._on_error, self.idle_wait_s
        )
        self._tenants: list[_Tenant] = []
        self._last: _Tenant | None = None
        self._stats_lock = threading.Lock()  # the accounts, read by stats() from other threads

    def add(
        self,
        name: str,
        step: Callable[[], bool],
        has_work: Callable[[], bool],
        on_error: Callable[[], None],
    ) -> None:
        """Register an engine (before `start()`); its `has_work` runs under `cond`."""
        share = self.shares.get(name, 1.0)
        if share <= 0:
            raise ValueError(f"the compute share of {name!r} must be > 0, got {share}")
        if any(t.name == name for t in self._tenants):
            raise ValueError(f"an engine named {name!r} is already on this step thread")
        self._tenants.append(_Tenant(name, step, has_work, on_error, share))

    def start(self) -> None:
        with self.cond:
            self.thread.start()

    def stats(self) -> list[TenantStats]:
        with self._stats_lock:
            return [TenantStats(t.name, t.share, t.steps, t.used_s, t.predicted_s)
                    for t in self._tenants]  # fmt: skip

    # --- the step thread ----------------------------------------------------------------------

    def _has_work(self) -> bool:
        return any(t.has_work() for t in self._tenants)

    def step(self) -> bool:
        """One engine's step (the chosen one; if it had nothing it could run, the next one's).
        False when no engine ran anything."""
        with self.cond:
            ready = [t for t in self._tenants if t.has_work()]
        with self._stats_lock:
            self._mark_active(ready)
        while ready:
            with self._stats_lock:
                tenant = ready.pop(choose([t.view() for t in ready]))
            self._last = tenant
            start = time.perf_counter()
            ran = tenant.step()
            elapsed = time.perf_counter() - start
            if ran:
                with self._stats_lock:
                    tenant.used_s += elapsed
                    tenant.steps += 1
                    tenant.predicted_s += EWMA_ALPHA * (elapsed - tenant.predicted_s)
                return True
        return False

    def _mark_active(self, ready: list[_Tenant]) -> None:
        names = {t.name for t in ready}
        others = [t.view() for t in self._tenants if t.active and t.name in names]
        for t in self._tenants:
            if t.name in names and not t.active:
                t.used_s = catch_up(t.used_s, t.share, others)
            t.active = t.name in names

    def _on_error(self) -> None:
        """A step raised: only the engine that raised aborts what it had."""
        if self._last is not None:
            self._last.on_error()
