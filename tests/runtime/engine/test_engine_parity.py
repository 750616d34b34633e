"""Parity gates of the engine (float64, greedy): determinism, N interleaved requests == each
alone, chunked prefill, preemption by recompute and prefix-cache hits all give the plain path's
tokens, and the work the model actually ran is what the accounting claims."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, RequestOutput, SamplingParams
from loom_runtime.models.loader import LoadedModel

Prompt = Callable[[int, int], tuple[int, ...]]
Greedy = Callable[..., SamplingParams]
Plain = Callable[[EngineRequest], CompletedRequest]
SpyForward = Callable[[LoadedModel], Any]


def config(**kw: object) -> EngineConfig:
    base: dict[str, object] = {"dtype": torch.float64, "max_model_len": 512, "num_blocks": 256}
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


def run_all(engine: Engine, reqs: list[EngineRequest]) -> dict[str, OutputCollector]:
    """Submit every request before the first step, then step until all are finished."""
    got = {r.request_id: OutputCollector(r) for r in reqs}
    for r in reqs:
        engine.add_request(r, got[r.request_id])
    for _ in range(10_000):
        if all(c.done.is_set() for c in got.values()):
            return got
        engine.step()
    raise AssertionError("requests did not finish within 10000 steps")


def test_same_request_twice_gives_the_same_tokens(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = Engine(tiny64, config())
    a = engine.generate(prompt(30, 1), greedy(12))
    b = engine.generate(prompt(30, 1), greedy(12))
    assert a.output_token_ids == b.output_token_ids and len(a.output_token_ids) == 12
    assert a.text == b.text and a.finish_reason == b.finish_reason == "length"


def test_sixteen_interleaved_requests_equal_each_alone(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy, plain: Plain, spy_forward: SpyForward
) -> None:
    lengths = [1, 3, 7, 15, 16, 17, 31, 33, 50, 64, 65, 90, 100, 128, 150, 200]
    reqs = []
    for i, n in enumerate(lengths):
        sampling = greedy(6 + (i * 5) % 17)
        if i % 5 == 4:  # seeded sampling rides along: its generator lives in its own state
            sampling = SamplingParams(
                max_tokens=10, temperature=0.8, top_p=0.9, top_k=50, seed=i, ignore_eos=True
            )
        reqs.append(EngineRequest(f"r{i}", prompt(n, 100 + i), sampling))
    alone = {r.request_id: plain(r).output_token_ids for r in reqs}
    spy = spy_forward(tiny64)
    engine = Engine(tiny64, config(max_num_batched_tokens=96, max_num_seqs=16))
    got = run_all(engine, reqs)
    together = {rid: c.result().output_token_ids for rid, c in got.items()}
    assert together == alone
    # and they really ran together: wide batches mixing prefill chunks with decode tokens
    assert max(len(b) for b in spy.batches) >= 12
    assert any(1 in b and max(b) > 1 for b in spy.batches)
    assert all(sum(b) <= 96 for b in spy.batches)


def test_a_long_prompt_is_chunked_and_decodes_never_starve(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy, plain: Plain, spy_forward: SpyForward
) -> None:
    engine = Engine(tiny64, config(max_num_batched_tokens=32))
    spy = spy_forward(tiny64)
    short = EngineRequest("short", prompt(5, 1), greedy(40))
    long = EngineRequest("long", prompt(200, 2), greedy(4))
    outs: dict[str, list[RequestOutput]] = {"short": [], "long": []}
    engine.add_request(short, outs["short"].append)
    engine.step()  # short's prefill; it decodes from now on
    engine.add_request(long, outs["long"].append)
    while not outs["long"]:
        before = len(outs["short"])
        engine.step()
        assert len(outs["short"]) == before + 1  # one decode token every step
        assert spy.batches[-1][0] == 1 and sum(spy.batches[-1]) <= 32  # decode first, in budget
    # 200 prompt tokens at <= 31 per step (one slot goes to the decode): 7 steps
    assert len(outs["short"]) == 1 + 7
    while engine.in_flight():
        engine.step()
    for req in (short, long):
        tokens = tuple(t for o in outs[req.request_id] for t in o.new_token_ids)
        assert tokens == plain(req).output_token_ids


def test_preempted_requests_finish_with_the_tokens_of_an_unpreempted_run(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy, plain: Plain
) -> None:
    # 8 blocks of 16 tokens: two 40-token prompts are admitted (3 blocks each), the others
    # wait; growing both towards 40 + 40 tokens (5 blocks each) forces preemption.
    engine = Engine(tiny64, config(num_blocks=8, max_model_len=128))
    reqs = [EngineRequest(f"p{i}", prompt(40, 10 + i), greedy(40)) for i in range(4)]
    got = run_all(engine, reqs)
    stats = engine.stats()
    assert stats.num_preemptions > 0
    preempted = [c.result().metrics.num_preemptions for c in got.values()]
    assert sum(preempted) == stats.num_preemptions
    for r in reqs:
        assert got[r.request_id].result().output_token_ids == plain(r).output_token_ids
    assert stats.num_free_blocks == stats.num_blocks  # nothing leaked


def test_a_shared_2k_prefix_is_served_from_cache_and_only_the_rest_is_computed(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy, plain: Plain, spy_forward: SpyForward
) -> None:
    engine = Engine(tiny64, config(max_model_len=2200, num_blocks=300))
    spy = spy_forward(tiny64)
    prefix = prompt(2048, 7)
    first = EngineRequest("first", prefix + prompt(30, 8), greedy(4))
    second = EngineRequest("second", prefix + prompt(25, 9), greedy(4))
    a = engine.generate(first.prompt_token_ids, first.sampling)
    ran_first = spy.tokens
    b = engine.generate(second.prompt_token_ids, second.sampling)
    ran_second = spy.tokens - ran_first
    assert a.num_cached_tokens == 0 and ran_first == 2078 + 3
    assert b.num_cached_tokens == 2048
    assert ran_second == 25 + 3  # the uncached tail, then three decode tokens
    assert engine.tokens_run == ran_first + ran_second
    stats = engine.stats()
    assert stats.prefix_hits == 2048 and stats.prefix_queries == 2078 + 2073
    # KV read from the cache is the KV the plain path computes: same tokens
    assert b.output_token_ids == plain(second).output_token_ids


def test_without_prefix_caching_everything_is_recomputed(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy, spy_forward: SpyForward
) -> None:
    engine = Engine(tiny64, config(prefix_caching=False))
    spy = spy_forward(tiny64)
    p = (*prompt(64, 3), 5)
    a = engine.generate(p, greedy(2))
    b = engine.generate(p, greedy(2))
    assert b.num_cached_tokens == 0 and spy.tokens == 2 * (65 + 1)
    assert a.output_token_ids == b.output_token_ids


def test_generate_builds_the_whole_result_from_streamed_outputs(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy, plain: Plain
) -> None:
    engine = Engine(tiny64, config())
    req = EngineRequest("g", prompt(12, 4), greedy(8))
    got = engine.generate(req.prompt_token_ids, req.sampling)
    ref = plain(req)
    assert got.output_token_ids == ref.output_token_ids and got.text == ref.text
    assert got.weights_version == "v1"
