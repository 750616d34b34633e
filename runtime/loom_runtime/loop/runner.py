"""LoopRunner: the sequential reference runner that drives one loop from init to finalize.

Owns the plain path parity tests compare against (no batching, each plan's own thunk);
never batches, reorders or splits plans, and keeps no state between runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from loom_runtime.errors import LoomError
from loom_runtime.loop.contract import Done, Loop, WorkPlan

logger = logging.getLogger(__name__)

ReqT = TypeVar("ReqT")
CtxT = TypeVar("CtxT")
StateT = TypeVar("StateT")
ResultT = TypeVar("ResultT")
OutT = TypeVar("OutT")


class LoopStepLimitError(LoomError):
    """A loop asked for more steps than its runner allows: the loop never reached Done."""


class LoopRunner(Generic[ReqT, CtxT, StateT, ResultT, OutT]):
    """Runs `init -> (next -> thunk -> advance)* -> finalize` for one request at a time.

    `max_steps` bounds a loop that never finishes. If a step raises, the state is still
    finalized (so a loop releases what it holds, e.g. KV blocks) and the error propagates.
    `on_plan` observes every plan before it runs (tests use it to count kinds and tokens).
    """

    def __init__(
        self,
        loop: Loop[ReqT, CtxT, StateT, ResultT, OutT],
        max_steps: int = 1_000_000,
        on_plan: Callable[[WorkPlan[ResultT]], None] | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.loop = loop
        self.max_steps = max_steps
        self.on_plan = on_plan

    def run(self, req: ReqT, ctx: CtxT) -> OutT:
        state = self.loop.init(req, ctx)
        try:
            for _ in range(self.max_steps):
                plan = self.loop.next(state)
                if isinstance(plan, Done):
                    return self.loop.finalize(state)
                if self.on_plan is not None:
                    self.on_plan(plan)
                state = self.loop.advance(state, plan.thunk())
        except BaseException:
            self._finalize_quietly(state)
            raise
        self._finalize_quietly(state)
        raise LoopStepLimitError(
            f"loop {self.loop.kind!r} did not finish within {self.max_steps} steps; "
            "raise max_steps if the request is legitimately that long"
        )

    def _finalize_quietly(self, state: StateT) -> None:
        try:
            self.loop.finalize(state)
        except Exception:
            logger.exception("finalize failed while unwinding", extra={"loop": self.loop.kind})
