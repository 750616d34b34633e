"""The paged latent KV cache: its bytes per token equal the capacity planner's figure for the
same sparse-mla shape (fp32, bf16 and fp8, tiny and GLM-5-class dims), a block is one contiguous
region, and rows written at slots are the rows gathered back, per layer, with index keys only on
the layers that own them; fp8 rows are stored as the packed bytes of kv/fp8.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from loom_operator.fleet.kv_layout import (
    Indexer,
    KVDtype,
    MLAAttention,
    ModelShape,
    kv_bytes_per_token,
)
from loom_runtime.kv.fp8 import Fp8Format, pack, pack_mla, unpack, unpack_mla
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.tiny import tiny_config_dict


def tiny_config() -> SparseMlaConfig:
    return SparseMlaConfig.from_dict(tiny_config_dict(1000, 1, [2]))


def planner_shape(config: SparseMlaConfig, kv_dtype: KVDtype, group: int = 128) -> ModelShape:
    return ModelShape(
        num_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        attention=MLAAttention(config.kv_lora_rank, config.qk_rope_head_dim),
        kv_dtype=kv_dtype,
        quant_group_size=group,
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
    assert cache.transferable  # the P/D connector's LatentLayout (transfer/layout.py)


@pytest.mark.parametrize("group", [128, 16, 8])
def test_fp8_bytes_per_token_equal_the_capacity_planner_at_tiny_dims(group: int) -> None:
    config = tiny_config()
    fmt = Fp8Format(group)
    spec = config.kv_spec(block_size=16, num_blocks=5, dtype=torch.float32, fp8=fmt)
    per_token = spec.bytes_per_block // 16
    assert per_token == kv_bytes_per_token(planner_shape(config, "fp8", group))
    # 4 layers of (32 e4m3 latent + its scales + 8 BF16 RoPE) + 2 indexer rows of 16 + scales
    latent_scales, index_scales = 4 * -(-32 // group), 4 * -(-16 // group)
    assert per_token == 4 * (32 + latent_scales + 16) + 2 * (16 + index_scales)
    cache = spec.allocate()
    assert cache.data.dtype == torch.uint8 and cache.data.nbytes == 5 * spec.bytes_per_block
    assert cache.data[2].nbytes == spec.bytes_per_block


def test_fp8_bytes_per_token_at_glm5_dims_are_reference_rows() -> None:
    """REFERENCE.md §A: 78 layers x 656 B + 21 indexer layers x 132 B (+ 788 B of MTP, which
    the runtime does not cache yet: the planner's 54,728 B)."""
    spec = LatentKVCacheSpec(
        78, 512, 64, tuple(range(21)), 128, block_size=64, num_blocks=1, fp8=Fp8Format(128)
    )
    assert (spec.stored_row_width, spec.stored_index_width) == (656, 132)
    per_token = spec.bytes_per_block // 64
    shape = ModelShape(
        num_layers=78,
        num_attention_heads=64,
        attention=MLAAttention(512, 64),
        kv_dtype="fp8",
        quant_group_size=128,
        indexer=Indexer(num_layers=21, head_dim=128, top_k=2048, num_heads=32),
    )
    assert per_token == kv_bytes_per_token(shape) == 78 * 656 + 21 * 132
    assert per_token + 788 == kv_bytes_per_token(replace(shape, mtp_layers=1)) == 54_728


def test_fp8_rows_are_stored_packed_and_gathered_dequantised() -> None:
    fmt = Fp8Format(4)
    spec = LatentKVCacheSpec(2, 6, 2, (1,), 4, block_size=4, num_blocks=3, fp8=fmt)
    cache = spec.allocate()
    slots = torch.tensor([2 * 4 + 3, 0 * 4 + 1])
    latent, rope, keys = torch.randn(2, 6), torch.randn(2, 2), torch.randn(2, 4)
    cache.write(1, slots, latent, rope, keys)
    # the stored bytes are the packed rows, as they are (what a P/D pull would move)
    assert torch.equal(cache.rows[2, 1, 3], pack_mla(latent, rope, fmt)[0])
    assert torch.equal(cache.index_rows[0, 0, 1], pack(keys, fmt)[1])
    lat, rot, got = cache.gather(1, torch.tensor([2, 0]))
    want_lat, want_rope = unpack_mla(pack_mla(latent, rope, fmt), 6, 2, fmt)
    assert got is not None and lat.dtype == torch.float32
    assert torch.equal(lat[[3, 5]], want_lat) and torch.equal(rot[[3, 5]], want_rope.float())
    assert torch.equal(got[[3, 5]], unpack(pack(keys, fmt), 4, fmt))
    assert not torch.equal(lat[[3, 5]], latent)  # fp8 is lossy: storage really is e4m3
    assert not cache.data[1].any()  # block 1 untouched


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
