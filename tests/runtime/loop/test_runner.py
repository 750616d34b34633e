"""LoopRunner drives one loop init -> (next -> thunk -> advance)* -> finalize, and always
finalizes (releasing what the state holds), even when a step fails or never ends."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from loom_runtime.loop.contract import Done, LoopContext, ResourceRequest, WorkPlan
from loom_runtime.loop.runner import LoopRunner, LoopStepLimitError


@dataclass
class CountState:
    remaining: int
    fail_at: int | None
    seen: list[int] = field(default_factory=list)
    holds_resource: bool = True
    version: str = ""


class CountdownLoop:
    """Toy loop: each step's thunk squares the counter; finalize releases the 'resource'."""

    kind = "countdown"

    def __init__(self, endless: bool = False) -> None:
        self.endless = endless
        self.finalized: list[CountState] = []

    def init(self, req: tuple[int, int | None], ctx: LoopContext) -> CountState:
        return CountState(remaining=req[0], fail_at=req[1], version=ctx.weights_version)

    def next(self, state: CountState) -> WorkPlan[int] | Done:
        if state.remaining == 0 and not self.endless:
            return Done("counted down")
        value = state.remaining

        def thunk() -> int:
            if value == state.fail_at:
                raise RuntimeError(f"kernel failed at {value}")
            return value * value

        return WorkPlan("tick", "tick", ResourceRequest(compute_tokens=1), thunk)

    def advance(self, state: CountState, result: int) -> CountState:
        state.seen.append(result)
        state.remaining = max(0, state.remaining - 1)
        return state

    def finalize(self, state: CountState) -> tuple[str, list[int]]:
        state.holds_resource = False
        self.finalized.append(state)
        return state.version, list(state.seen)


def test_runs_every_step_in_order_and_returns_finalize() -> None:
    loop = CountdownLoop()
    plans: list[WorkPlan[int]] = []
    runner = LoopRunner(loop, on_plan=plans.append)
    assert runner.run((3, None), LoopContext(weights_version="v9")) == ("v9", [9, 4, 1])
    assert [p.kind for p in plans] == ["tick"] * 3
    assert len(loop.finalized) == 1 and not loop.finalized[0].holds_resource


def test_a_failing_step_still_finalizes_and_propagates() -> None:
    loop = CountdownLoop()
    with pytest.raises(RuntimeError, match="failed at 2"):
        LoopRunner(loop).run((3, 2), LoopContext())
    assert loop.finalized[0].seen == [9]
    assert not loop.finalized[0].holds_resource


def test_a_loop_that_never_finishes_hits_the_step_limit() -> None:
    loop = CountdownLoop(endless=True)
    with pytest.raises(LoopStepLimitError, match="5 steps"):
        LoopRunner(loop, max_steps=5).run((2, None), LoopContext())
    assert len(loop.finalized[0].seen) == 5 and not loop.finalized[0].holds_resource


def test_runner_keeps_no_state_between_runs() -> None:
    runner = LoopRunner(CountdownLoop())
    assert runner.run((2, None), LoopContext()) == runner.run((2, None), LoopContext())
