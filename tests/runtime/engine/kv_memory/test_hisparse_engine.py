"""The engine with Hybrid HiSparse decode (float64, greedy, index_topk 64 < the contexts, a hot
buffer smaller than a decode's working set): concurrent chunked requests and preempted ones give
the one-sequence forward's tokens, only misses cross host -> device, finishing and preemption free
both tiers, the host pool sizes the block pool so a fixed device budget holds more blocks, and
models or settings it cannot serve are refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.runtime.engine.sparse_mla_helpers import (
    Prompt,
    greedy,
    inner,
    one_sequence,
    run_all,
)

from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import HiSparseKVCache
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK


def pool_gib(loaded: LoadedModel, blocks: int) -> float:
    """A host pool of exactly `blocks` float64 blocks of 16 tokens (whole latent blocks: rows
    and indexer keys)."""
    spec = loaded.config.kv_spec(16, 1, torch.float64)
    assert isinstance(spec, LatentKVCacheSpec)
    return blocks * spec.bytes_per_block / (1 << 30)


def hisparse_of(engine: Engine) -> HiSparseKVCache:
    cache = engine._runner.cache
    assert isinstance(cache, HiSparseKVCache)
    return cache


def test_concurrent_chunked_requests_equal_the_one_sequence_forward(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    lengths = [9, 70, 130, 300]  # > INDEX_TOPK from 70 on; > 96 (one chunk) from 130 on
    assert INDEX_TOPK == 64
    reqs = [EngineRequest(f"r{i}", prompt(n, 500 + i), greedy(24)) for i, n in enumerate(lengths)]
    config = EngineConfig(
        dtype=torch.float64,
        hisparse_host_pool_gib=pool_gib(sparse64, 64),
        hisparse_hot_slots=INDEX_TOPK + 1,  # smaller than a 24-step decode's working set
        max_model_len=512,
        max_num_batched_tokens=96,
        max_num_seqs=8,
    )
    engine = Engine(sparse64, config)
    got = run_all(engine, reqs)
    for r in reqs:
        assert got[r.request_id] == one_sequence(inner(sparse64), r.prompt_token_ids, 24)
    s = engine.stats()
    assert s.num_blocks == 64 and s.num_free_blocks == 64
    assert s.hisparse_hot_misses > 4 * (INDEX_TOPK + 1)  # some layer's buffer evicted rows
    assert s.hisparse_hot_hits > 0 and s.hisparse_prefill_h2d_bytes > 0
    assert s.hisparse_h2d_bytes == s.hisparse_hot_misses * 40 * 8  # a 40-float64 row each
    assert s.hisparse_hot_requests == 0  # finishing released every hot buffer
    assert s.hisparse_host_pool_bytes == 64 * 16 * (4 * 40 + 2 * 16) * 8  # rows and keys


def test_preempted_requests_finish_with_the_one_sequence_tokens_and_free_both_tiers(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    # 8 host blocks of 16: two 40-token prompts fit, growing both to 80 tokens forces preemption
    config = EngineConfig(
        dtype=torch.float64, hisparse_host_pool_gib=pool_gib(sparse64, 8), max_model_len=128
    )
    engine = Engine(sparse64, config)
    released: list[str] = []
    cache = hisparse_of(engine)
    release = cache.release

    def spy(request_id: str) -> None:
        released.append(request_id)
        release(request_id)

    engine._loop.on_free = spy
    reqs = [EngineRequest(f"p{i}", prompt(40, 10 + i), greedy(40)) for i in range(3)]
    got = run_all(engine, reqs)
    s = engine.stats()
    assert s.num_preemptions > 0
    assert len(released) == 3 + s.num_preemptions  # every finish and every preemption
    assert s.hisparse_hot_requests == 0 and s.num_free_blocks == s.num_blocks == 8
    for r in reqs:
        assert got[r.request_id] == one_sequence(inner(sparse64), r.prompt_token_ids, 40)


def test_a_shared_prefix_is_served_from_the_host_pool_with_identical_tokens(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    config = EngineConfig(
        dtype=torch.float64, hisparse_host_pool_gib=pool_gib(sparse64, 64), max_model_len=512
    )
    engine = Engine(sparse64, config)
    prefix = prompt(160, 7)
    first, second = prefix + prompt(20, 8), prefix + prompt(15, 9)
    a = engine.generate(first, greedy(6))
    b = engine.generate(second, greedy(6))
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 160  # 10 whole blocks
    model = inner(sparse64)
    assert a.output_token_ids == one_sequence(model, first, 6)
    assert b.output_token_ids == one_sequence(model, second, 6)


def fp8_config(fp8: Fp8Format, **tiers: Any) -> EngineConfig:
    return EngineConfig(
        dtype=torch.float64, max_model_len=512, max_num_batched_tokens=96, kv_fp8=fp8, **tiers
    )


def test_fp8_rows_give_the_all_on_device_fp8_tokens(sparse64: LoadedModel, prompt: Prompt) -> None:
    """Packed rows cross as stored; a row read in its own step is rounded as a later read is."""
    fp8 = Fp8Format(16)
    plain = Engine(sparse64, fp8_config(fp8, num_blocks=60))
    hisparse = Engine(
        sparse64,
        fp8_config(
            fp8, hisparse_host_pool_gib=pool_gib(sparse64, 60), hisparse_hot_slots=INDEX_TOPK + 1
        ),
    )
    reqs = [EngineRequest(f"f{i}", prompt(n, 900 + i), greedy(16)) for i, n in enumerate([9, 200])]
    assert run_all(hisparse, reqs) == run_all(plain, reqs)
    s = hisparse.stats()
    assert s.hisparse_hot_misses > 0
    assert s.hisparse_h2d_bytes == s.hisparse_hot_misses * (32 + 2 * 4 + 8 * 2)  # packed rows


def run_counting_peak(
    engine: Engine, reqs: list[EngineRequest]
) -> tuple[dict[str, tuple[int, ...]], int]:
    """Every request's tokens, and the most requests that ran in one step."""
    got = {r.request_id: OutputCollector(r) for r in reqs}
    for r in reqs:
        engine.add_request(r, got[r.request_id])
    peak = 0
    for _ in range(10_000):
        if all(c.done.is_set() for c in got.values()):
            return {k: c.result().output_token_ids for k, c in got.items()}, peak
        engine.step()
        peak = max(peak, engine.stats().num_running)
    raise AssertionError("requests did not finish within 10000 steps")


def test_a_fixed_device_budget_holds_more_blocks_with_a_host_pool(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    budget = 40 * 16 * (4 * 40 + 2 * 16) * 8  # 40 all-on-device float64 blocks
    plain = Engine(
        sparse64, EngineConfig(dtype=torch.float64, kv_cache_gib=budget / 2**30, max_model_len=512)
    )
    hisparse = Engine(
        sparse64,
        EngineConfig(
            dtype=torch.float64,
            kv_cache_gib=budget / 2**30,
            hisparse_host_pool_gib=pool_gib(sparse64, 150),
            hisparse_hot_slots=INDEX_TOPK + 1,
            max_model_len=512,
            max_num_seqs=4,
        ),
    )
    assert plain.stats().num_blocks == 40  # one request of 512 tokens (32 blocks)
    s = hisparse.stats()
    assert s.num_blocks == 150  # every block the host pool holds: four requests of 512 tokens
    spec = hisparse_of(hisparse).spec
    # the device keeps 150 blocks' indexer keys and four hot buffers, within the same budget
    assert s.kv_cache_bytes == spec.device_bytes == 150 * 16 * 2 * 16 * 8 + 4 * 4 * 65 * 40 * 8
    assert spec.device_bytes <= budget
    # four requests of 20 blocks each: the plain pool runs two at a time, HiSparse all four
    reqs = [EngineRequest(f"b{i}", prompt(300, 700 + i), greedy(8)) for i in range(4)]
    plain_tokens, plain_peak = run_counting_peak(plain, reqs)
    hi_tokens, hi_peak = run_counting_peak(hisparse, reqs)
    assert (plain_peak, hi_peak) == (2, 4)
    assert hi_tokens == plain_tokens
    with pytest.raises(ValueError, match="over the budget"):
        Engine(
            sparse64,
            EngineConfig(
                dtype=torch.float64,
                kv_cache_gib=budget / 2**30,
                hisparse_host_pool_gib=pool_gib(sparse64, 150),
                max_model_len=512,
                max_num_seqs=4,  # the default 129-slot buffers do not fit beside the keys
            ),
        )


def test_models_and_settings_hisparse_cannot_serve_are_refused(
    sparse64: LoadedModel, tiny64: LoadedModel
) -> None:
    with pytest.raises(ValueError, match="needs a sparse-mla model"):
        Engine(tiny64, EngineConfig(dtype=torch.float64, hisparse_host_pool_gib=0.01))
    with pytest.raises(ValueError, match="fewer than one request"):
        Engine(
            sparse64,
            EngineConfig(
                dtype=torch.float64, hisparse_host_pool_gib=pool_gib(sparse64, 3), max_model_len=64
            ),
        )
