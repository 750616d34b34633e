"""The capacity planner reproduces REFERENCE.md §A and its DCP shard math holds for any length."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom_operator.fleet.capacity import (
    GIB,
    H200,
    RolePlan,
    dcp_local_length,
    indexer_crossover,
    longest_fitting,
    max_local_length,
    plan_capacity,
    sparse_intensity,
)
from loom_operator.fleet.kv_layout import (
    CapacityError,
    GQAAttention,
    Indexer,
    MLAAttention,
    ModelShape,
    attention_layer_bytes,
    indexer_layer_bytes,
    kv_breakdown,
    kv_bytes_per_token,
)

GLM5 = ModelShape(
    num_layers=78,
    num_attention_heads=64,
    attention=MLAAttention(kv_lora_rank=512, qk_rope_head_dim=64),
    kv_dtype="fp8",
    quant_group_size=128,
    indexer=Indexer(num_layers=21, head_dim=128, top_k=2048, num_heads=32),
    mtp_layers=1,
)
PREFILL = RolePlan(name="prefill", pcp=8, dcp=8, ep=8)
DECODE = RolePlan(name="decode", dp=8, ep=8)
MIB = 1 << 20
ONE_M = 1_048_576


def test_glm5_layer_bytes_match_the_reference_layout() -> None:
    assert attention_layer_bytes(GLM5) == 512 + 16 + 128 == 656
    assert indexer_layer_bytes(GLM5) == 128 + 4 == 132
    assert kv_breakdown(GLM5).mtp_layer_bytes == 788


def test_glm5_kv_bytes_per_token_is_54728() -> None:
    assert kv_bytes_per_token(GLM5) == 78 * 656 + 21 * 132 + 788 == 54_728


def test_bf16_mla_has_no_scales_and_bf16_indexer() -> None:
    bf16 = replace(GLM5, kv_dtype="bf16")
    assert attention_layer_bytes(bf16) == (512 + 64) * 2 == 1152
    assert indexer_layer_bytes(bf16) == 256


def test_gqa_layer_counts_k_and_v_and_tp_splits_kv_heads() -> None:
    gqa = ModelShape(
        num_layers=32, num_attention_heads=32, attention=GQAAttention(8, 128), kv_dtype="bf16"
    )
    assert attention_layer_bytes(gqa) == 2 * 8 * 128 * 2
    assert kv_bytes_per_token(gqa) == 32 * 4096
    assert attention_layer_bytes(gqa, tp=4) == 2 * 2 * 128 * 2
    assert attention_layer_bytes(gqa, tp=16) == 2 * 1 * 128 * 2  # replicas past 8 ranks
    fp8 = replace(gqa, kv_dtype="fp8")
    assert attention_layer_bytes(fp8) == 2 * 8 * (128 + 4)


def test_tp_replicates_mla_latent() -> None:
    assert kv_bytes_per_token(GLM5, tp=8) == kv_bytes_per_token(GLM5) == 54_728


def test_one_million_tokens_is_54728_mib_or_53_4_gib() -> None:
    report = plan_capacity(GLM5, (PREFILL,), ONE_M, 15 * GIB)
    assert report.kv_bytes == 54_728 * MIB
    assert round(report.kv_bytes / GIB, 1) == 53.4


def test_dcp8_holds_6_7_gib_per_gpu_and_pcp_alone_replicates() -> None:
    report = plan_capacity(GLM5, (PREFILL, DECODE, RolePlan("pcp-only", pcp=8)), ONE_M, 15 * GIB)
    prefill, decode, pcp_only = report.roles
    assert prefill.kv_bytes_per_rank == 131_072 * 54_728
    assert round(prefill.kv_bytes_per_rank / GIB, 1) == 6.7
    assert prefill.fits
    assert decode.kv_bytes_per_rank == pcp_only.kv_bytes_per_rank == 54_728 * MIB
    assert not decode.fits


def test_max_context_is_the_longest_length_within_the_budget() -> None:
    report = plan_capacity(GLM5, (PREFILL, DECODE), ONE_M, 15 * GIB)
    per_rank_tokens = 15 * GIB // 54_728
    assert per_rank_tokens == 294_294
    assert report.roles[0].max_context == 8 * per_rank_tokens
    assert report.roles[1].max_context == per_rank_tokens


def test_sparse_mla_intensity_is_26_under_tp8_and_191_under_pcp8() -> None:
    tp8 = sparse_intensity(GLM5, heads=8)
    pcp8 = sparse_intensity(GLM5, heads=64)
    assert tp8 is not None and pcp8 is not None
    assert 2048 * (656 + 4) == 1_351_680
    assert (tp8.flops, tp8.bytes) == (8 * 2048 * 2176, 1_351_680 + 8 * 2176)
    assert (pcp8.flops, pcp8.bytes) == (64 * 2048 * 2176, 1_351_680 + 64 * 2176)
    assert round(tp8.flops / 1e6, 1) == 35.7 and round(tp8.bytes / 1e6, 2) == 1.37
    assert round(pcp8.flops / 1e6) == 285 and round(pcp8.bytes / 1e6, 2) == 1.49
    assert round(tp8.flops_per_byte) == 26
    assert round(pcp8.flops_per_byte) == 191
    assert round(H200.ridge) == 206


def test_report_compares_tp_and_pcp_over_the_largest_replica() -> None:
    comparison = plan_capacity(GLM5, (PREFILL, DECODE), ONE_M, 15 * GIB).comparison
    assert comparison is not None
    assert comparison.ranks == 8
    assert (comparison.tp.heads, comparison.pcp.heads) == (8, 64)
    assert round(comparison.tp.flops_per_byte) == 26
    assert round(comparison.pcp.flops_per_byte) == 191


def test_indexer_overtakes_sparse_mla_near_32k_under_tp8_and_256k_under_pcp8() -> None:
    tp8, pcp8 = indexer_crossover(GLM5, tp=8), indexer_crossover(GLM5, tp=1)
    # 2 · 2048 · (78 layers · heads · 2176) / (21 layers · 2 · 32 · 128), rounded up
    assert tp8 == -(-2 * 2048 * 78 * 8 * 2176 // (21 * 2 * 32 * 128)) == 32_330
    assert pcp8 == -(-2 * 2048 * 78 * 64 * 2176 // (21 * 2 * 32 * 128)) == 258_634
    assert abs(tp8 - 32 * 1024) / (32 * 1024) < 0.02
    assert abs(pcp8 - 256 * 1024) / (256 * 1024) < 0.02


def test_dense_models_have_no_sparse_figures() -> None:
    gqa = ModelShape(num_layers=2, num_attention_heads=4, attention=GQAAttention(2, 16))
    no_heads = replace(GLM5, indexer=Indexer(21, 128, 2048))
    assert sparse_intensity(gqa, 4) is None
    assert indexer_crossover(gqa, 1) is None
    assert indexer_crossover(no_heads, 1) is None
    assert plan_capacity(gqa, (RolePlan("aggregated"),), 10, GIB).comparison is None


def test_invalid_parallelism_is_rejected_with_the_field_named() -> None:
    with pytest.raises(CapacityError, match="dcp"):
        RolePlan("prefill", dcp=0)
    with pytest.raises(CapacityError, match="tp=3"):
        plan_capacity(GLM5, (RolePlan("prefill", tp=3),), 10, GIB)


lengths = st.integers(min_value=0, max_value=5000)
worlds = st.integers(min_value=1, max_value=16)
interleaves = st.integers(min_value=1, max_value=64)


@given(lengths, worlds, interleaves)
def test_dcp_shards_sum_to_the_sequence_and_differ_by_at_most_the_interleave(
    length: int, world: int, interleave: int
) -> None:
    local = [dcp_local_length(length, world, interleave, r) for r in range(world)]
    assert sum(local) == length
    assert max(local) - min(local) <= interleave
    assert max(local) == max_local_length(length, world, interleave)


@given(st.integers(min_value=0, max_value=600), st.integers(1, 8), st.integers(1, 8))
def test_dcp_local_length_matches_brute_force_placement(
    length: int, world: int, interleave: int
) -> None:
    counts = [0] * world
    for t in range(length):
        counts[(t // interleave) % world] += 1
    assert counts == [dcp_local_length(length, world, interleave, r) for r in range(world)]


@given(st.integers(min_value=0, max_value=10_000), worlds, interleaves)
def test_longest_fitting_is_the_largest_length_within_the_rank_budget(
    tokens: int, world: int, interleave: int
) -> None:
    length = longest_fitting(tokens, world, interleave)
    assert max_local_length(length, world, interleave) <= tokens
    assert max_local_length(length + 1, world, interleave) > tokens
