"""The per-sequence cache: the bytes one token costs equal the capacity planner's prediction
for the same architecture numbers, and the rows a forward writes are the ones read back."""

from __future__ import annotations

import pytest
import torch

from loom_operator.fleet.kv_layout import (
    Indexer,
    KVDtype,
    MLAAttention,
    ModelShape,
    kv_bytes_per_token,
)
from loom_runtime.models.sparse_mla.cache import GROW_ROWS, SparseMlaCache, grown_rows
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla


def planner_shape(config: SparseMlaConfig, kv_dtype: KVDtype) -> ModelShape:
    """The planner's view of the trunk. mtp_layers=0: the MTP layer is loaded but not run yet,
    so nothing is cached for it (the planner adds 1 attention + 1 indexer row per MTP layer)."""
    return ModelShape(
        num_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        attention=MLAAttention(config.kv_lora_rank, config.qk_rope_head_dim),
        kv_dtype=kv_dtype,
        indexer=Indexer(
            num_layers=len(config.full_indexer_layers),
            head_dim=config.index_head_dim,
            top_k=config.index_topk,
            num_heads=config.index_n_heads,
        ),
        mtp_layers=0,
    )


@pytest.mark.parametrize(("dtype", "kv_dtype"), [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_bytes_per_token_equal_the_capacity_planner(
    ours: LoadedSparseMla, dtype: torch.dtype, kv_dtype: KVDtype
) -> None:
    config = ours.config
    cache = SparseMlaCache(config, capacity=16, dtype=dtype)
    assert cache.bytes_per_token == kv_bytes_per_token(planner_shape(config, kv_dtype))
    # 4 layers x (32 latent + 8 RoPE) + 2 full indexer layers x 16, times the element size
    assert cache.bytes_per_token == (4 * 40 + 2 * 16) * torch.finfo(dtype).bits // 8


def test_rows_written_by_a_forward_are_read_back_in_order(ours: LoadedSparseMla) -> None:
    config = ours.config
    cache = ours.model.new_cache(10)
    ours.model.forward(torch.arange(4), cache)
    latent = torch.randn(3, config.kv_lora_rank, dtype=torch.float64)
    rope = torch.randn(3, config.qk_rope_head_dim, dtype=torch.float64)
    keys = torch.randn(3, config.index_head_dim, dtype=torch.float64)
    rows = cache.write(0, latent, rope, keys)
    assert rows.index_keys is not None and rows.latent.shape[0] == 7
    assert torch.equal(rows.latent[4:], latent) and torch.equal(rows.index_keys[4:], keys)
    shared = cache.write(1, latent, rope, keys)
    assert shared.index_keys is None  # shared-indexer layers keep no keys
    assert cache.index_keys.shape[0] == len(config.full_indexer_layers) == 2


def test_the_rows_are_allocated_as_the_sequence_grows_and_kept(ours: LoadedSparseMla) -> None:
    """Memory follows the tokens held, not the capacity: 64 rows at first, at least a quarter
    more at a time in runs of 64, never past the capacity; the rows written survive a grow."""
    config = ours.config
    cache = SparseMlaCache(config, capacity=1000, dtype=torch.float64)
    assert cache.allocated == GROW_ROWS == cache.latent.shape[1] == 64
    written = []
    for size in (40, 40, 300, 500):
        latent = torch.randn(size, config.kv_lora_rank, dtype=torch.float64)
        rope = torch.randn(size, config.qk_rope_head_dim, dtype=torch.float64)
        for layer in range(config.num_hidden_layers):
            rows = cache.write(layer, latent, rope, None)
        cache.advance(size)
        written.append(latent)
        assert cache.latent.shape[1] == cache.allocated >= cache.length
    assert [grown_rows(a, n, 1000) for a, n in ((64, 80), (128, 380), (384, 880))] == [
        128,
        384,
        896,
    ]
    assert cache.allocated == 896  # for 880 tokens
    assert grown_rows(896, 1000, 1000) == 1000  # capped at the capacity
    assert torch.equal(rows.latent, torch.cat(written))
