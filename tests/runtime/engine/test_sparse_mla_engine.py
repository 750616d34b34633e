"""The engine serves the sparse-mla family (float64, greedy, index_topk 64 < the contexts):
several concurrent requests of different lengths, chunked prefill, prefix-cache hits and
preemption give the one-sequence forward's tokens (which equal transformers'), its KV figures
equal the planner's (fp8 KV too, whose concurrent chunked requests equal each one alone), and a
P/D role is refused with a clear error."""

from __future__ import annotations

from unittest.mock import MagicMock

import torch
from tests.runtime.engine.sparse_mla_helpers import (
    Prompt,
    greedy,
    inner,
    one_sequence,
    planner_shape,
    run_all,
)

from loom_operator.fleet.kv_layout import (
    kv_bytes_per_token,
)
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.transfer_port import DisaggSettings
from loom_runtime.engine.types import EngineRequest
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.latent_cache import LatentKVCache, LatentKVCacheSpec
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.causal_lm import SparseMlaCausalLM
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK


def test_load_model_picks_the_sparse_mla_family_from_config_json(sparse64: LoadedModel) -> None:
    assert isinstance(sparse64.config, SparseMlaConfig)
    assert isinstance(sparse64.model, SparseMlaCausalLM)
    model = inner(sparse64)
    trunk = sum(t.numel() for n, t in model.targets().items() if ".layers.4." not in n)
    assert sparse64.config.num_parameters == trunk  # layer 4 is the MTP layer: not counted


def test_concurrent_chunked_requests_equal_the_one_sequence_forward(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    lengths = [5, 40, 70, 130, 260]  # > INDEX_TOPK from 70 on; > 96 (one chunk) from 130 on
    assert INDEX_TOPK == 64
    reqs = [EngineRequest(f"r{i}", prompt(n, 300 + i), greedy(8)) for i, n in enumerate(lengths)]
    engine = Engine(
        sparse64,
        EngineConfig(
            dtype=torch.float64,
            num_blocks=80,
            max_model_len=512,
            max_num_batched_tokens=96,
            max_num_seqs=8,
        ),
    )
    got = run_all(engine, reqs)
    for r in reqs:
        assert got[r.request_id] == one_sequence(inner(sparse64), r.prompt_token_ids, 8)
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_a_shared_prefix_is_served_from_cache_with_identical_tokens(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    engine = Engine(sparse64, EngineConfig(dtype=torch.float64, num_blocks=64, max_model_len=512))
    prefix = prompt(160, 7)
    first = prefix + prompt(20, 8)
    second = prefix + prompt(15, 9)
    a = engine.generate(first, greedy(6))
    b = engine.generate(second, greedy(6))
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 160  # 10 whole blocks
    model = inner(sparse64)
    assert a.output_token_ids == one_sequence(model, first, 6)
    assert b.output_token_ids == one_sequence(model, second, 6)


def test_preempted_requests_finish_with_the_one_sequence_tokens(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    # 8 blocks of 16: two 40-token prompts fit, growing both to 80 tokens forces preemption
    engine = Engine(sparse64, EngineConfig(dtype=torch.float64, num_blocks=8, max_model_len=128))
    reqs = [EngineRequest(f"p{i}", prompt(40, 10 + i), greedy(40)) for i in range(3)]
    got = run_all(engine, reqs)
    assert engine.stats().num_preemptions > 0
    for r in reqs:
        assert got[r.request_id] == one_sequence(inner(sparse64), r.prompt_token_ids, 40)


def test_kv_bytes_are_the_latent_pool_and_the_planners_per_token_figure(
    sparse64: LoadedModel,
) -> None:
    engine = Engine(sparse64, EngineConfig(dtype=torch.float64, num_blocks=40, max_model_len=512))
    shape = planner_shape(sparse64, "fp32")
    stats = engine.stats()
    # float64 KV is twice the planner's fp32 figure (the planner has no fp64 precision)
    assert stats.kv_bytes_per_token == 2 * kv_bytes_per_token(shape) == (4 * 40 + 2 * 16) * 8
    assert stats.kv_cache_bytes == 40 * 16 * stats.kv_bytes_per_token
    assert isinstance(engine._runner.cache, LatentKVCache)


def test_fp8_kv_bytes_are_the_planners_and_chunked_requests_equal_each_alone(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    """Packed rows at the tiny dims (latent 32, RoPE 8, indexer 16; groups of 16): the planner's
    fp8 figure. Every row is read back as stored, so interleaving and chunking change nothing."""
    fp8 = Fp8Format(16)
    config = EngineConfig(
        dtype=torch.float64,
        num_blocks=60,
        max_model_len=512,
        max_num_batched_tokens=96,
        kv_fp8=fp8,
    )
    engine = Engine(sparse64, config)
    shape = planner_shape(sparse64, "fp8", group=16)
    stats = engine.stats()
    per_token = 4 * (32 + 2 * 4 + 8 * 2) + 2 * (16 + 4)
    assert stats.kv_bytes_per_token == kv_bytes_per_token(shape) == per_token
    assert stats.kv_cache_bytes == 60 * 16 * per_token
    reqs = [EngineRequest(f"r{i}", prompt(n, 400 + i), greedy(6)) for i, n in enumerate([9, 150])]
    together = run_all(engine, reqs)
    for r in reqs:
        assert together[r.request_id] == run_all(Engine(sparse64, config), [r])[r.request_id]


def test_a_pd_role_binds_the_latent_cache_with_its_spec(sparse64: LoadedModel) -> None:
    connector = MagicMock()
    config = EngineConfig(dtype=torch.float64, num_blocks=8, max_model_len=128)
    Engine(sparse64, config, None, DisaggSettings(role="prefill"), connector)
    (kv, _, fp8, spec), _ = connector.bind.call_args
    assert isinstance(spec, LatentKVCacheSpec) and fp8 is None
    assert kv.nbytes == 8 * spec.bytes_per_block


def test_a_hisparse_pd_role_binds_its_host_tier_as_the_whole_latent_cache(
    sparse64: LoadedModel,
) -> None:
    """P/D moves the host tier (rows and keys, the ordinary latent layout), not the device's
    key-only tensor; the device figures stay those of the keys and hot buffers."""
    connector = MagicMock()
    config = EngineConfig(
        dtype=torch.float64, num_blocks=8, max_model_len=128, hisparse_host_pool_gib=0.01
    )
    engine = Engine(sparse64, config, None, DisaggSettings(role="decode"), connector)
    (kv, _, fp8, spec), _ = connector.bind.call_args
    assert spec == sparse64.config.kv_spec(16, 8, torch.float64, None) and fp8 is None
    assert kv.nbytes == 8 * spec.bytes_per_block and kv.device.type == "cpu"
    stats, keys = engine.stats(), 8 * 16 * 2 * 16 * 8  # 2 indexer layers of 16 float64s
    assert stats.hisparse_host_pool_bytes == kv.nbytes
    assert stats.kv_cache_bytes == keys + config.max_num_seqs * 4 * 129 * 40 * 8  # + hot buffers
