"""execute_plans runs one step's plans: every plan goes to the executor of its shape, plans of
one shape together in one call, and each loop gets its own result back, in plan order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from loom_runtime.loop.contract import Done, LoopContext, ResourceRequest, WorkPlan
from loom_runtime.loop.execute import NoExecutorError, execute_plans


@dataclass
class CountState:
    remaining: int
    fail_at: int | None
    seen: list[int] = field(default_factory=list)
    holds_resource: bool = True
    version: str = ""


class CountdownLoop:
    """Toy loop: each step's plan asks for its counter squared; finalize releases the 'resource'."""

    kind = "countdown"

    def __init__(self) -> None:
        self.finalized: list[CountState] = []

    def init(self, req: tuple[int, int | None], ctx: LoopContext) -> CountState:
        return CountState(remaining=req[0], fail_at=req[1], version=ctx.weights_version)

    def next(self, state: CountState) -> WorkPlan[int] | Done:
        if state.remaining == 0:
            return Done("counted down")
        work = (state.remaining, state.fail_at)
        return WorkPlan("tick", "tick", ResourceRequest(compute_tokens=1), work=work)

    def advance(self, state: CountState, result: int) -> CountState:
        state.seen.append(result)
        state.remaining = max(0, state.remaining - 1)
        return state

    def finalize(self, state: CountState) -> tuple[str, list[int]]:
        state.holds_resource = False
        self.finalized.append(state)
        return state.version, list(state.seen)


@dataclass
class SquareExecutor:
    """Executor of "tick" plans: squares each counter; records the size of every call."""

    calls: list[int] = field(default_factory=list)

    def execute(self, plans: Sequence[WorkPlan[int]]) -> list[int]:
        self.calls.append(len(plans))
        out = []
        for plan in plans:
            value, fail_at = plan.work  # type: ignore[misc]
            if value == fail_at:
                raise RuntimeError(f"kernel failed at {value}")
            out.append(value * value)
        return out


def drive(
    loop: CountdownLoop, states: list[CountState], executor: SquareExecutor
) -> list[WorkPlan[int]]:
    """What a scheduler does each step: next for every live loop, one execute, advance each."""
    seen: list[WorkPlan[int]] = []
    live = list(states)
    while live:
        plans = [(s, p) for s in live if not isinstance(p := loop.next(s), Done)]
        live = [s for s, _ in plans]
        if not plans:
            break
        results = execute_plans([p for _, p in plans], {"tick": executor})
        seen += [p for _, p in plans]
        for (state, _), result in zip(plans, results, strict=True):
            loop.advance(state, result)
    return seen


def test_runs_every_step_in_order_and_returns_finalize() -> None:
    loop, executor = CountdownLoop(), SquareExecutor()
    state = loop.init((3, None), LoopContext(weights_version="v9"))
    plans = drive(loop, [state], executor)
    assert loop.finalize(state) == ("v9", [9, 4, 1])
    assert [p.kind for p in plans] == ["tick"] * 3
    assert len(loop.finalized) == 1 and not loop.finalized[0].holds_resource


def test_plans_of_one_shape_run_in_one_call_and_each_gets_its_own_result() -> None:
    loop, executor = CountdownLoop(), SquareExecutor()
    states = [loop.init((n, None), LoopContext()) for n in (3, 1, 2)]
    drive(loop, states, executor)
    assert executor.calls == [3, 2, 1]  # one call per step, as many plans as live loops
    assert [s.seen for s in states] == [[9, 4, 1], [1], [4, 1]]


def test_shapes_go_to_their_executors_and_results_keep_plan_order() -> None:
    def plan(shape: str, value: int) -> WorkPlan[int]:
        return WorkPlan("tick", shape, ResourceRequest(compute_tokens=1), work=(value, None))

    a, b = SquareExecutor(), SquareExecutor()
    plans = [plan("a", 1), plan("b", 2), plan("a", 3), plan("b", 4)]
    assert execute_plans(plans, {"a": a, "b": b}) == [1, 4, 9, 16]
    assert a.calls == [2] and b.calls == [2]


def test_a_failing_step_propagates_and_keeps_what_ran_before() -> None:
    loop, executor = CountdownLoop(), SquareExecutor()
    state = loop.init((3, 2), LoopContext())
    with pytest.raises(RuntimeError, match="failed at 2"):
        drive(loop, [state], executor)
    assert state.seen == [9]


def test_a_plan_without_an_executor_is_refused() -> None:
    plan = WorkPlan("vae_tile", ("vae", 64), ResourceRequest(compute_tokens=4), request_id="r")
    with pytest.raises(NoExecutorError, match="vae"):
        execute_plans([plan], {"tick": SquareExecutor()})


def test_an_executor_that_loses_a_result_is_refused() -> None:
    class Lossy:
        def execute(self, plans: Sequence[WorkPlan[int]]) -> list[int]:
            return [0]

    tick = WorkPlan("tick", "tick", ResourceRequest(compute_tokens=1))
    with pytest.raises(ValueError, match="1 results for 2 plans"):
        execute_plans([tick, tick], {"tick": Lossy()})


def test_the_executor_keeps_no_state_between_steps() -> None:
    def run() -> list[int]:
        loop = CountdownLoop()
        state = loop.init((2, None), LoopContext())
        drive(loop, [state], SquareExecutor())
        return state.seen

    assert run() == run()
