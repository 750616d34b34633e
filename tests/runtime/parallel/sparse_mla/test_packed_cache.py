"""PackedCache (a rank's fp8 rows): a write returns the context exactly as a one-rank fp8
paged pool gives it back, rows read out equal those, an empty write (a DCP rank owning none of
a step's tokens) changes nothing, and a token costs the fp8 pool's bytes."""

from __future__ import annotations

import pytest
import torch

from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.parallel.sparse_mla.packed_cache import PackedCache

FP8 = Fp8Format(16)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> SparseMlaConfig:
    return SparseMlaConfig.from_dir(init_tiny_sparse_mla(tmp_path_factory.mktemp("p") / "t"))


def rows(config: SparseMlaConfig, n: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    dims = (config.kv_lora_rank, config.qk_rope_head_dim, config.index_head_dim)
    return tuple(torch.randn(n, d, generator=gen, dtype=torch.float64) for d in dims)


def test_the_context_reads_back_as_the_fp8_pool_stores_it(config: SparseMlaConfig) -> None:
    cache = PackedCache(config, 64, FP8, torch.float64)
    pool = config.kv_spec(16, 4, torch.float64, FP8).allocate()
    layer = config.full_indexer_layers[0]
    for step, n in enumerate((5, 0, 3)):  # the empty step: a rank that owns none of them
        latent, rope, keys = rows(config, n, step)
        got = cache.write(layer, latent, rope, keys)
        cache.advance(n)
        slots = torch.arange(cache.length - n, cache.length)
        if n:
            pool.write(layer, slots, latent, rope, keys)
    want = pool.read(layer, torch.arange(cache.length))
    assert got.index_keys is not None and want[2] is not None
    assert torch.equal(got.latent, want[0]) and torch.equal(got.rope_keys, want[1])
    assert torch.equal(got.index_keys, want[2])
    latent, rope, keys = cache.rows_between(2, 8)
    assert torch.equal(latent[layer], want[0][2:8]) and torch.equal(rope[layer], want[1][2:8])
    assert cache.rows_between(3, 3)[0].shape[1] == 0  # nothing owned: nothing to export


def test_a_token_costs_the_fp8_pools_bytes(config: SparseMlaConfig) -> None:
    cache = PackedCache(config, 16, FP8, torch.float64)
    assert cache.bytes_per_token == config.kv_spec(16, 1, torch.float64, FP8).bytes_per_block // 16
    with pytest.raises(ValueError, match="do not fit"):
        cache.check_room(17)
