"""Samples of one prompt (n > 1): the first sample prefills the prompt; the others wait for its
KV, take its full blocks from the prefix cache, and each produces exactly what it would alone
(float64, seeded sampling); an abort while they wait leaks nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.runtime.engine.conftest import PlainRun

from loom_runtime.engine.ar_state import ARDecodeState
from loom_runtime.engine.batcher import Batcher
from loom_runtime.engine.runner import TOKEN_FORWARD
from loom_runtime.engine.types import EngineRequest, RequestOutput, SamplingParams
from loom_runtime.loop.contract import LoopContext
from loom_runtime.models.loader import LoadedModel

Prompt = Callable[[int, int], tuple[int, ...]]
BLOCK = 16


def samples(ids: tuple[int, ...], n: int, max_tokens: int) -> list[EngineRequest]:
    """What the server makes of one prompt with n samples: seed + position, the others naming
    the first."""
    return [
        EngineRequest(
            f"r-{k}",
            ids,
            SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=7 + k, ignore_eos=True),
            shares_prompt_of=None if k == 0 else "r-0",
        )
        for k in range(n)
    ]


def run(
    rig: Any, reqs: list[EngineRequest], token_budget: int
) -> tuple[Batcher, list[ARDecodeState], list[RequestOutput], list[int]]:
    """Every request added at once; the step's computed tokens, step by step."""
    outs: list[RequestOutput] = []
    batcher = Batcher(rig.loop, {TOKEN_FORWARD: rig.forward}, (token_budget, 8), outs.append)
    states = [rig.loop.init(r, LoopContext(weights_version="plain")) for r in reqs]
    for s in states:
        batcher.add(s)
    computed = []
    while batcher.step():
        computed.append(batcher.counters.num_tokens_computed)
    return batcher, states, outs, computed


def tokens_of(outs: list[RequestOutput], rid: str) -> list[int]:
    return [t for o in outs if o.request_id == rid for t in o.new_token_ids]


def test_the_samples_share_one_prefill_and_each_equals_its_own_request_alone(
    tiny64: LoadedModel, make_loop: Callable[..., Any], prompt: Prompt, plain: PlainRun
) -> None:
    ids = prompt(70, 3)  # four full blocks and a partial one
    reqs = samples(ids, 4, 6)
    rig = make_loop(tiny64, num_blocks=64, prefix_caching=True)
    batcher, states, outs, _ = run(rig, reqs, token_budget=512)  # room for all four at once
    for req in reqs:
        alone = plain(EngineRequest(req.request_id, ids, req.sampling))
        assert tokens_of(outs, req.request_id) == list(alone.output_token_ids)
    assert len({tuple(tokens_of(outs, r.request_id)) for r in reqs}) > 1  # own generators
    full = (len(ids) - 1) // BLOCK * BLOCK
    assert [s.num_cached_tokens for s in states] == [0, full, full, full]
    computed = batcher.counters.num_tokens_computed
    assert computed == len(ids) + 3 * (len(ids) - full) + 4 * 5  # each sample's last token
    assert not batcher.has_work and rig.loop.kv.pool.num_free == 64


def test_a_sample_whose_first_sample_is_gone_prefills_for_itself(
    tiny64: LoadedModel, make_loop: Callable[..., Any], prompt: Prompt, plain: PlainRun
) -> None:
    ids = prompt(40, 4)
    follower = samples(ids, 2, 4)[1]
    rig = make_loop(tiny64, num_blocks=32, prefix_caching=True)
    _, states, outs, _ = run(rig, [follower], token_budget=64)
    assert states[0].num_cached_tokens == 0
    alone = plain(EngineRequest("r-1", ids, follower.sampling))
    assert tokens_of(outs, "r-1") == list(alone.output_token_ids)


def test_samples_aborted_while_they_wait_finish_with_abort_and_leak_nothing(
    tiny64: LoadedModel, make_loop: Callable[..., Any], prompt: Prompt
) -> None:
    ids = prompt(70, 5)
    rig = make_loop(tiny64, num_blocks=32, prefix_caching=True)
    outs: list[RequestOutput] = []
    batcher = Batcher(rig.loop, {TOKEN_FORWARD: rig.forward}, (16, 8), outs.append)
    for r in samples(ids, 3, 4):
        batcher.add(rig.loop.init(r, LoopContext()))
    assert batcher.step()  # the first sample's first chunk; the others wait for its prompt
    assert sorted(batcher.parked) == ["r-0"] and batcher.stats_counts()["num_waiting"] == 2
    batcher.abort({"r-1", "r-2"})
    finals = {o.request_id: o.finish_reason for o in outs if o.finished}
    assert finals == {"r-1": "abort", "r-2": "abort"} and not batcher.parked
    batcher.abort_all()
    assert not batcher.has_work and rig.loop.kv.pool.num_free == 32


def test_without_prefix_caching_the_samples_run_at_once(
    tiny64: LoadedModel, make_loop: Callable[..., Any], prompt: Prompt, plain: PlainRun
) -> None:
    ids = prompt(40, 6)
    reqs = samples(ids, 3, 4)
    rig = make_loop(tiny64, num_blocks=32, prefix_caching=False)
    batcher, states, outs, _ = run(rig, reqs, token_budget=256)
    assert [s.num_cached_tokens for s in states] == [0, 0, 0]
    for req in reqs:
        assert tokens_of(outs, req.request_id) == list(plain(req).output_token_ids)
    assert not batcher.has_work
