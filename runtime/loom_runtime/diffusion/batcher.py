"""The diffusion batcher: every running diffusion loop's next plan in one step, each shape to its
executor in one call, then every loop advanced; cancellation takes effect at a step boundary.

Owns the waiting queue and the running set of diffusion requests; single-threaded, never blocks.
(The LLM's Batcher and this one may share one step thread: engine/shared_step_thread.py.)
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable, Mapping

from loom_runtime.diffusion.loop import DiffusionLoop, DiffusionState
from loom_runtime.diffusion.types import DiffusionOutput, DiffusionResult
from loom_runtime.loop.contract import Done, Executor, WorkPlan
from loom_runtime.loop.execute import execute_plans

logger = logging.getLogger(__name__)


class DiffusionBatcher:
    """Admits up to `max_running` requests in arrival order; `emit` gets each finished output."""

    def __init__(
        self,
        loop: DiffusionLoop,
        executors: Mapping[Hashable, Executor[DiffusionResult]],
        emit: Callable[[DiffusionOutput], None],
        max_running: int = 8,
    ) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.loop, self.executors, self.emit = loop, executors, emit
        self.max_running = max_running
        self.waiting: deque[DiffusionState] = deque()
        self.running: list[DiffusionState] = []
        self.steps = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, state: DiffusionState) -> None:
        self.waiting.append(state)

    def abort(self, request_ids: set[str]) -> None:
        """Finish these requests at once with finish_reason "abort", freeing what they hold."""
        for state in [s for s in [*self.running, *self.waiting] if s.request_id in request_ids]:
            self.loop.abort(state)
            self._finish(state)

    def step(self) -> bool:
        """schedule -> execute -> advance, once; False when nothing ran."""
        while self.waiting and len(self.running) < self.max_running:
            self.running.append(self.waiting.popleft())
        batch: list[tuple[DiffusionState, WorkPlan[DiffusionResult]]] = []
        for state in list(self.running):
            plan = self.loop.next(state)
            if isinstance(plan, Done):
                self._finish(state)
            else:
                batch.append((state, plan))
        if not batch:
            return False
        try:
            results = execute_plans([plan for _, plan in batch], self.executors)
        except Exception:
            logger.exception("diffusion step failed; aborting its requests")
            for state, _ in batch:
                self.loop.abort(state)
                self._finish(state)
            return True
        self.steps += 1
        for (state, _), result in zip(batch, results, strict=True):
            self.loop.advance(state, result)
            if state.phase == "done":
                self._finish(state)
        return True

    def _finish(self, state: DiffusionState) -> None:
        if state in self.running:
            self.running.remove(state)
        elif state in self.waiting:
            self.waiting.remove(state)
        self.emit(self.loop.finalize(state))
