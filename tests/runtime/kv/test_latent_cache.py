"""The paged latent KV cache: its bytes per token equal the capacity planner's figure for the
same sparse-mla shape, a block is one contiguous region, and rows written at slots are the rows
gathered back, per layer, with index keys only on the layers that own them."""

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
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.tiny import tiny_config_dict


def tiny_config() -> SparseMlaConfig:
    return SparseMlaConfig.from_dict(tiny_config_dict(1000, 1, [2]))


def planner_shape(config: SparseMlaConfig, kv_dtype: KVDtype) -> ModelShape:
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
        mtp_layers=0,  # the MTP layer is loaded but caches nothing yet
    )


@pytest.mark.parametrize(("dtype", "kv_dtype"), [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_bytes_per_token_equal_the_capacity_planner(dtype: torch.dtype, kv_dtype: KVDtype) -> None:
    config = tiny_config()
    spec = config.kv_spec(block_size=16, num_blocks=5, dtype=dtype)
    assert spec.bytes_per_block // 16 == kv_bytes_per_token(planner_shape(config, kv_dtype))
    assert spec.bytes_per_block // 16 == (4 * 40 + 2 * 16) * torch.finfo(dtype).bits // 8
    cache = spec.allocate()
    assert cache.data.nbytes == 5 * spec.bytes_per_block
    assert cache.data.is_contiguous() and cache.data[3].nbytes == spec.bytes_per_block
    assert not cache.transferable


def test_rows_written_at_slots_are_gathered_back_per_layer() -> None:
    spec = LatentKVCacheSpec(3, 6, 2, (0, 2), 4, block_size=4, num_blocks=6, dtype=torch.float64)
    cache = spec.allocate()
    slots = torch.tensor([5 * 4 + 1, 2 * 4 + 3, 5 * 4 + 0])  # block 5 offsets 1, 0; block 2 @3
    latent, rope, keys = torch.randn(3, 6), torch.randn(3, 2), torch.randn(3, 4)
    cache.write(2, slots, latent, rope, keys)
    cache.write(1, slots, latent + 1, rope + 1, None)  # a shared-indexer layer keeps no keys
    lat, rot, got = cache.gather(2, torch.tensor([5, 2]))
    assert lat.shape == (8, 6) and got is not None
    assert torch.equal(lat[[1, 7, 0]], latent.double()) and torch.equal(
        rot[[1, 7, 0]], rope.double()
    )
    assert torch.equal(got[[1, 7, 0]], keys.double())
    lat1, _, none = cache.gather(1, torch.tensor([5]))
    assert none is None and torch.equal(lat1[[1, 0]], (latent[[0, 2]] + 1).double())
    # everything written lives inside blocks 5 and 2: the other blocks are still zero
    others = [b for b in range(6) if b not in (2, 5)]
    assert not cache.data[others].any()
    with pytest.raises(ValueError, match="index keys"):
        cache.write(0, slots, latent, rope, None)
