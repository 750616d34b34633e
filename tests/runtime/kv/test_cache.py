"""The llama paged KV cache in fp8: its bytes per token equal the planner's GQA fp8 figure, it
stores each head's packed row (e4m3 values, then fp32 scales) as kv/fp8.py packs it, and gathers
the dequantised rows back at the right slots; plain dtypes are unchanged."""

from __future__ import annotations

import pytest
import torch

from loom_operator.fleet.kv_layout import GQAAttention, ModelShape, kv_bytes_per_token
from loom_runtime.kv.cache import KVCacheSpec
from loom_runtime.kv.fp8 import Fp8Format, pack, unpack


@pytest.mark.parametrize(
    ("layers", "heads", "head_dim", "group", "per_token"),
    [
        (6, 2, 64, 128, 6 * 2 * 2 * (64 + 4)),  # the tiny llama
        (6, 2, 64, 16, 6 * 2 * 2 * (64 + 16)),
        (32, 8, 128, 128, 32 * 2 * 8 * 132),  # a Llama-3-8B-class model
    ],
)
def test_fp8_bytes_per_token_equal_the_capacity_planner(
    layers: int, heads: int, head_dim: int, group: int, per_token: int
) -> None:
    spec = KVCacheSpec(layers, heads, head_dim, 16, 3, fp8=Fp8Format(group))
    shape = ModelShape(
        num_layers=layers,
        num_attention_heads=heads * 4,
        attention=GQAAttention(heads, head_dim),
        kv_dtype="fp8",
        quant_group_size=group,
    )
    assert spec.bytes_per_block // 16 == kv_bytes_per_token(shape) == per_token
    cache = spec.allocate()
    assert cache.data.dtype == torch.uint8 and cache.data.nbytes == 3 * spec.bytes_per_block
    assert cache.data[1].nbytes == spec.bytes_per_block and cache.transferable


def test_fp8_rows_are_stored_packed_and_gathered_dequantised() -> None:
    fmt = Fp8Format(8)
    spec = KVCacheSpec(2, 3, 16, block_size=4, num_blocks=4, dtype=torch.float64, fp8=fmt)
    cache = spec.allocate()
    slots = torch.tensor([3 * 4 + 2, 1 * 4 + 0, 3 * 4 + 1])
    k, v = torch.randn(3, 3, 16, dtype=torch.float64), torch.randn(3, 3, 16, dtype=torch.float64)
    cache.write(1, slots, k, v)
    assert torch.equal(cache.data[3, 1, 0, 2], pack(k, fmt)[0])  # [heads, 16 + 2 scales * 4]
    assert torch.equal(cache.data[1, 1, 1, 0], pack(v, fmt)[1])
    keys, values = cache.gather(1, torch.tensor([3, 1]))
    assert keys.shape == (8, 3, 16) and keys.dtype == torch.float64
    assert torch.equal(keys[[2, 4, 1]], unpack(pack(k, fmt), 16, fmt).double())
    assert torch.equal(values[[2, 4, 1]], unpack(pack(v, fmt), 16, fmt).double())
    assert not cache.data[[0, 2]].any() and not cache.data[:, 0].any()  # other blocks, layer 0


def test_plain_rows_are_stored_as_given() -> None:
    spec = KVCacheSpec(1, 2, 4, block_size=2, num_blocks=2, dtype=torch.float32)
    cache = spec.allocate()
    k = torch.randn(1, 2, 4)
    cache.write(0, torch.tensor([3]), k, -k)
    keys, values = cache.gather(0, torch.tensor([1]))
    assert torch.equal(keys[1], k[0]) and torch.equal(values[1], -k[0])
    assert spec.bytes_per_block == 1 * 2 * 2 * 2 * 4 * 4


@pytest.mark.parametrize("fp8", [False, True])
def test_gather_blocks_is_gather_laid_out_block_by_block(fp8: bool) -> None:
    fmt = Fp8Format() if fp8 else None
    spec = KVCacheSpec(3, 2, 16, 4, 10, torch.float32, fp8=fmt)
    kv = spec.allocate()
    gen = torch.Generator().manual_seed(0)
    for layer in range(3):
        k = torch.randn(40, 2, 16, generator=gen)
        kv.write(layer, torch.arange(40), k, -k)
    blocks = torch.tensor([7, 2, 5])
    got = kv.gather_blocks(1, blocks)
    keys, values = kv.gather(1, blocks)
    assert got.shape == (3, 2, 4, 2, 16) and got.is_contiguous()
    assert torch.equal(got[:, 0].reshape(-1, 2, 16), keys)
    assert torch.equal(got[:, 1].reshape(-1, 2, 16), values)
