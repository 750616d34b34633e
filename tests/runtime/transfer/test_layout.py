"""Copy plans between KV layouts: every token of the range lands in the right slot of the right
block for any block sizes and orders on the two sides, nothing else is touched, and equal layouts
move whole runs of blocks in single segments; head caches and sparse-mla latent caches alike, and
never one onto the other."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.latent_cache import LatentKVCache, LatentKVCacheSpec
from loom_runtime.transfer.connector import latent_layout_of
from loom_runtime.transfer.layout import (
    KVLayout,
    LatentLayout,
    LayoutError,
    apply_plan,
    check_compatible,
    copy_plan,
    layout_from_dict,
)

LAYERS, HEADS, DIM = 2, 1, 2


def layout(num_blocks: int, block_size: int, order: str = "block_major") -> KVLayout:
    return KVLayout(num_blocks, LAYERS, block_size, HEADS, DIM, "float32", 4, order)  # type: ignore[arg-type]


def pool(lay: KVLayout, fill: bool) -> torch.Tensor:
    if lay.order == "block_major":
        shape = (lay.num_blocks, LAYERS, 2, lay.block_size, HEADS, DIM)
    else:
        shape = (LAYERS, 2, lay.num_blocks, lay.block_size, HEADS, DIM)
    n = int(np.prod(shape))
    return (
        torch.arange(1, n + 1, dtype=torch.float32).reshape(shape) if fill else torch.zeros(shape)
    )


def token(t: torch.Tensor, lay: KVLayout, blocks: list[int], i: int) -> torch.Tensor:
    """[LAYERS, 2, HEADS, DIM]: token i of the sequence stored in `blocks`."""
    b, s = blocks[i // lay.block_size], i % lay.block_size
    return t[b, :, :, s] if lay.order == "block_major" else t[:, :, b, s]


def as_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None)
@given(
    src_bs=st.sampled_from([2, 4, 8, 16]),
    dst_bs=st.sampled_from([2, 4, 8, 16]),
    src_order=st.sampled_from(["block_major", "layer_major"]),
    dst_order=st.sampled_from(["block_major", "layer_major"]),
    length=st.integers(min_value=1, max_value=60),
    data=st.data(),
)
def test_a_plan_moves_exactly_the_token_range(
    src_bs: int, dst_bs: int, src_order: str, dst_order: str, length: int, data: st.DataObject
) -> None:
    src_l, dst_l = layout(40, src_bs, src_order), layout(40, dst_bs, dst_order)
    src_blocks = data.draw(st.permutations(range(40)))[: -(-length // src_bs)]
    dst_blocks = data.draw(st.permutations(range(40)))[: -(-length // dst_bs)]
    start = data.draw(st.integers(min_value=0, max_value=length))
    src, dst = pool(src_l, fill=True), pool(dst_l, fill=False)
    plan = copy_plan(src_l, src_blocks, dst_l, dst_blocks, start, length)
    apply_plan(plan, as_bytes(src), as_bytes(dst))
    assert plan.nbytes == (length - start) * src_l.bytes_per_token()
    for i in range(-(-length // dst_bs) * dst_bs):
        got = token(dst, dst_l, dst_blocks, i)
        if start <= i < length:
            assert torch.equal(got, token(src, src_l, src_blocks, i)), i
        else:
            assert not got.any(), i  # outside the range: untouched
    moved = int((dst != 0).sum())
    assert moved == (length - start) * LAYERS * 2 * HEADS * DIM  # nothing else was written


def test_equal_layouts_move_runs_of_consecutive_blocks_as_one_segment() -> None:
    lay = layout(64, 16)
    plan = copy_plan(lay, list(range(8, 16)), lay, list(range(40, 48)), 0, 128)
    assert (plan.num_segments, plan.nbytes) == (1, 8 * lay.block_bytes)
    scattered = copy_plan(lay, [3, 9, 1, 7], lay, [5, 2, 8, 0], 0, 64)
    assert scattered.num_segments == 4  # one descriptor per block: the whole block, all layers


def test_incompatible_layouts_are_refused_with_the_difference() -> None:
    other = KVLayout(8, LAYERS, 4, 2, DIM, "float32", 4)
    with pytest.raises(LayoutError, match="num_kv_heads 1 != 2"):
        copy_plan(layout(8, 4), [0], other, [0], 0, 4)
    half = KVLayout(8, LAYERS, 4, HEADS, DIM, "bfloat16", 2)
    with pytest.raises(LayoutError, match="dtype float32 != bfloat16"):
        copy_plan(layout(8, 4), [0], half, [0], 0, 4)


def test_missing_or_foreign_blocks_are_refused() -> None:
    lay = layout(8, 4)
    with pytest.raises(LayoutError, match="need 3"):
        copy_plan(lay, [0, 1], lay, [0, 1, 2], 0, 9)
    with pytest.raises(LayoutError, match="outside"):
        copy_plan(lay, [0, 99], lay, [0, 1], 0, 8)
    with pytest.raises(LayoutError, match="range"):
        copy_plan(lay, [0], lay, [0], 3, 2)


def test_an_empty_range_is_an_empty_plan() -> None:
    plan = copy_plan(layout(8, 4), [0], layout(8, 4), [1], 2, 2)
    assert (plan.num_segments, plan.nbytes) == (0, 0)


def test_layouts_survive_the_handshake() -> None:
    lay = layout(8, 4, "layer_major")
    assert KVLayout.from_dict(lay.to_dict()) == lay
    with pytest.raises(LayoutError, match="malformed"):
        KVLayout.from_dict({"num_blocks": 1})


def test_fp8_layouts_count_each_heads_scales_and_say_so_in_the_handshake() -> None:
    fp8 = KVLayout(8, LAYERS, 4, 2, 64, "float8_e4m3fn", 1, scale_group=128)
    assert fp8.row_bytes == 2 * (64 + 4)  # the planner's fp8 GQA row: values + one fp32 scale
    assert fp8.bytes_per_token() == LAYERS * 2 * 2 * 68
    assert KVLayout.from_dict(fp8.to_dict()) == fp8
    older = {k: v for k, v in layout(8, 4).to_dict().items() if k != "scale_group"}
    assert KVLayout.from_dict(older).scale_group == 0  # a peer from before fp8: unquantised
    finer = KVLayout(8, LAYERS, 4, 2, 64, "float8_e4m3fn", 1, scale_group=32)
    with pytest.raises(LayoutError, match="scale_group 128 != 32"):
        copy_plan(fp8, [0], finer, [0], 0, 4)
    with pytest.raises(LayoutError, match="scale_group must be >= 0"):
        KVLayout(8, LAYERS, 4, 2, 64, "float8_e4m3fn", 1, scale_group=-1)


# --- latent (sparse-mla) layouts: the same planner over latent and indexer row planes ---------

LATENT = {"num_layers": 3, "latent_dim": 8, "rope_dim": 4, "index_layers": (0, 2), "index_dim": 4}


def latent_cache(num_blocks: int, block_size: int, fp8: Fp8Format | None) -> LatentKVCache:
    spec = LatentKVCacheSpec(**LATENT, block_size=block_size, num_blocks=num_blocks, fp8=fp8)  # type: ignore[arg-type]
    return spec.allocate()


def latent_token(cache: LatentKVCache, blocks: list[int], i: int) -> tuple[torch.Tensor, ...]:
    """The bytes of token i's latent rows [layers, width] and indexer rows [index layers, width]
    (bytes: random bits are NaNs as floats)."""
    b, s = blocks[i // cache.spec.block_size], i % cache.spec.block_size
    rows = (cache.rows[b, :, s], cache.index_rows[b, :, s])
    return tuple(r.contiguous().view(torch.uint8) for r in rows)


@settings(max_examples=60, deadline=None)
@given(
    src_bs=st.sampled_from([2, 4, 8]),
    dst_bs=st.sampled_from([2, 4, 8]),
    fp8=st.sampled_from([None, Fp8Format(4)]),
    length=st.integers(min_value=1, max_value=40),
    data=st.data(),
)
def test_a_latent_plan_moves_every_row_plane_of_the_token_range(
    src_bs: int, dst_bs: int, fp8: Fp8Format | None, length: int, data: st.DataObject
) -> None:
    """Planned on the connector's layout of real LatentKVCaches: the plan agrees with the
    cache's own views, across block sizes, for plain rows and packed fp8 bytes alike."""
    src, dst = latent_cache(24, src_bs, fp8), latent_cache(24, dst_bs, fp8)
    src.data.view(torch.uint8).copy_(torch.randint(1, 256, src.data.view(torch.uint8).shape))
    src_l, dst_l = latent_layout_of(src.data, src.spec), latent_layout_of(dst.data, dst.spec)
    src_blocks = data.draw(st.permutations(range(24)))[: -(-length // src_bs)]
    dst_blocks = data.draw(st.permutations(range(24)))[: -(-length // dst_bs)]
    start = data.draw(st.integers(min_value=0, max_value=length))
    plan = copy_plan(src_l, src_blocks, dst_l, dst_blocks, start, length)
    apply_plan(plan, as_bytes(src.data), as_bytes(dst.data))
    assert plan.nbytes == (length - start) * src_l.bytes_per_token()
    assert src_l.block_bytes == src.spec.bytes_per_block
    for i in range(-(-length // dst_bs) * dst_bs):
        got = latent_token(dst, dst_blocks, i)
        if start <= i < length:
            want = latent_token(src, src_blocks, i)
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), i
        else:
            assert not any(g.any() for g in got), i  # outside the range: untouched
    assert int((dst.data.view(torch.uint8) != 0).sum()) == plan.nbytes  # nothing else written


def test_equal_latent_layouts_move_runs_of_consecutive_blocks_as_one_segment() -> None:
    lay = LatentLayout(64, 3, 16, 8, 4, (0, 2), 4, "float32", 4)
    plan = copy_plan(lay, list(range(8, 16)), lay, list(range(40, 48)), 0, 128)
    assert (plan.num_segments, plan.nbytes) == (1, 8 * lay.block_bytes)
    assert lay.block_bytes == 16 * 4 * (3 * 12 + 2 * 4)


def test_fp8_latent_rows_have_the_glm5_sizes() -> None:
    """REFERENCE.md §A: a 656-byte latent row, a 132-byte indexer row, 54,728 bytes a token over
    78 attention layers + the MTP layer and 21 + 1 indexer layers."""
    lay = LatentLayout(1, 79, 1, 512, 64, tuple(range(22)), 128, "float8_e4m3fn", 1, 128)
    assert (lay.latent_row_bytes, lay.index_row_bytes) == (656, 132)
    assert lay.bytes_per_token() == 54_728


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"latent_dim": 16}, "latent_dim 8 != 16"),
        ({"index_layers": (0,)}, r"index_layers \(0, 2\) != \(0,\)"),
        ({"dtype": "float8_e4m3fn", "elem_bytes": 1, "scale_group": 4}, "dtype float32 != float8"),
    ],
)
def test_latent_layouts_of_other_dims_or_dtypes_are_refused_with_the_difference(
    change: dict[str, object], message: str
) -> None:
    ours = LatentLayout(8, 3, 4, 8, 4, (0, 2), 4, "float32", 4)
    theirs = replace(ours, **change)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match=message):
        copy_plan(ours, [0], theirs, [0], 0, 4)


def test_a_head_cache_and_a_latent_cache_are_refused_by_name() -> None:
    latent = LatentLayout(8, 3, 4, 8, 4, (0, 2), 4, "float32", 4)
    with pytest.raises(LayoutError, match=r"prefill holds a paged head cache \(llama-style"):
        check_compatible(layout(8, 4), latent)
    with pytest.raises(LayoutError, match=r"decode holds a paged head cache .* same model"):
        copy_plan(latent, [0], layout(8, 4), [0], 0, 4)


def test_the_handshake_carries_the_layout_kind() -> None:
    latent = LatentLayout(8, 3, 4, 8, 4, (0, 2), 4, "float8_e4m3fn", 1, 4)
    assert latent.to_dict()["kind"] == "latent" and layout(8, 4).to_dict()["kind"] == "heads"
    assert layout_from_dict(latent.to_dict()) == latent
    assert layout_from_dict(layout(8, 4, "layer_major").to_dict()) == layout(8, 4, "layer_major")
    older = {k: v for k, v in layout(8, 4).to_dict().items() if k != "kind"}
    assert layout_from_dict(older) == layout(8, 4)  # a peer from before latent layouts: heads
    with pytest.raises(LayoutError, match="unknown kind 'mamba'"):
        layout_from_dict({**latent.to_dict(), "kind": "mamba"})
    with pytest.raises(LayoutError, match="malformed latent"):
        layout_from_dict({"kind": "latent", "num_blocks": 1})
    with pytest.raises(LayoutError, match="index_layers"):
        LatentLayout(8, 3, 4, 8, 4, (3,), 4, "float32", 4)
