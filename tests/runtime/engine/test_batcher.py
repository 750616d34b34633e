"""The batcher's step when execution fails: the loops of the failed batch finish with
"abort" and release everything they hold, and what they produced before the failure is kept."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from loom_runtime.engine.batcher import Batcher
from loom_runtime.engine.runner import TOKEN_FORWARD
from loom_runtime.engine.token_forward import TokenResult
from loom_runtime.engine.types import EngineRequest, RequestOutput, SamplingParams
from loom_runtime.loop.contract import LoopContext, WorkPlan
from loom_runtime.models.loader import LoadedModel

Prompt = Callable[[int, int], tuple[int, ...]]
Greedy = Callable[..., SamplingParams]


def test_a_failing_step_finalizes_its_loops_with_abort(
    tiny32: LoadedModel, make_loop: Callable[..., Any], prompt: Prompt, greedy: Greedy
) -> None:
    rig = make_loop(tiny32, num_blocks=8)

    class FailsOnSecondStep:
        calls = 0

        def execute(self, plans: Sequence[WorkPlan[TokenResult]]) -> list[TokenResult]:
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("kernel failed")
            results: list[TokenResult] = rig.forward.execute(plans)
            return results

    outs: list[RequestOutput] = []
    batcher = Batcher(rig.loop, {TOKEN_FORWARD: FailsOnSecondStep()}, (2048, 4), outs.append)
    states = [
        rig.loop.init(EngineRequest(r, prompt(9, i), greedy(5)), LoopContext())
        for i, r in enumerate("ab")
    ]
    for state in states:
        batcher.add(state)
    while batcher.step():
        pass
    finals = [o for o in outs if o.finished]
    assert sorted(o.request_id for o in finals) == ["a", "b"]
    assert all(o.finish_reason == "abort" for o in finals)
    assert [s.num_output_tokens for s in states] == [1, 1]  # the first step's tokens are kept
    assert rig.loop.kv.pool.is_whole() and not batcher.has_work
    assert batcher.counters.num_requests_aborted == 2


def test_the_prefill_backlog_counts_prompt_tokens_not_computed_yet(
    tiny32: LoadedModel, make_loop: Callable[..., Any], prompt: Prompt, greedy: Greedy
) -> None:
    rig = make_loop(tiny32, num_blocks=16)
    batcher = Batcher(rig.loop, {TOKEN_FORWARD: rig.forward}, (8, 4), lambda _: None)
    for i, (rid, n) in enumerate((("a", 9), ("b", 12))):
        batcher.add(rig.loop.init(EngineRequest(rid, prompt(n, i), greedy(3)), LoopContext()))
    backlog = [batcher.prefill_backlog_tokens()]
    while batcher.step():
        backlog.append(batcher.prefill_backlog_tokens())
    assert backlog[:4] == [21, 13, 5, 0]  # 8 prompt tokens a step (chunked), then decode only
    assert backlog[-1] == 0


def test_arrived_prompt_tokens_count_on_arrival_before_any_step(
    tiny32: LoadedModel, make_loop: Callable[..., Any], prompt: Prompt, greedy: Greedy
) -> None:
    """The offered prefill load: a request's prompt counts as it arrives, while
    num_prompt_tokens (vllm:prompt_tokens) waits for it to be scheduled."""
    rig = make_loop(tiny32, num_blocks=16)
    batcher = Batcher(rig.loop, {TOKEN_FORWARD: rig.forward}, (8, 1), lambda _: None)
    for i, (rid, n) in enumerate((("a", 9), ("b", 12))):
        batcher.add(rig.loop.init(EngineRequest(rid, prompt(n, i), greedy(2)), LoopContext()))
    assert batcher.counters.num_prompt_tokens_arrived == 21
    assert batcher.counters.num_prompt_tokens == 0
    assert batcher.stats_counts()["num_prompt_tokens_arrived"] == 21
    batcher.step()  # one sequence at a time: only "a" is scheduled
    assert batcher.counters.num_prompt_tokens == 9
    assert batcher.counters.num_prompt_tokens_arrived == 21
