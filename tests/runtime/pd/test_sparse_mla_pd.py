"""P/D == aggregated for the sparse-mla family: a prefill Engine and a decode Engine joined by
real TCP and NIXL connectors move the latent cache (latent + RoPE rows and indexer key rows,
plain or packed fp8) across block sizes (32 vs 16, so every pull converts layout), and the decode
continues with the aggregated greedy tokens, prompts past the indexer's top-k included. A
HiSparse decode pulls into its host tier and copies the pulled keys to the device.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.runtime.engine.sparse_mla_helpers import RecordingDrafter
from tests.runtime.pd.engine_workers import Workers, run, wait_for, whole

from loom_runtime.engine.engine import Engine
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import HiSparseSpec
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK
from loom_runtime.wire.kv_transfer import KVTransferParams

MAX_TOKENS = 6
LENGTHS = (9, 150, 300)  # one block; several; ~5x the indexer's top-k (64) and 10+ blocks
FP8 = {"plain": None, "fp8": Fp8Format(16)}


def prompt(n: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(int(t) for t in torch.randint(10, 1000, (n,), generator=gen))


def prefilled(prefill: Engine, rid: str, tokens: tuple[int, ...]) -> KVTransferParams:
    """Run the prompt on the prefill; the transfer params its answer gives the decode."""
    answer = run(prefill, rid, tokens, 1, KVTransferParams.for_prefill()).outputs[-1]
    assert answer.kv_transfer_params is not None
    return KVTransferParams.parse(answer.kv_transfer_params.to_dict())


@pytest.mark.parametrize("kv", list(FP8))
@pytest.mark.parametrize("kind", ["tcp", "nixl"])
def test_sparse_mla_pd_equals_aggregated_across_block_sizes(
    workers: Workers, kind: str, kv: str
) -> None:
    fp8 = FP8[kv]
    assert max(LENGTHS) > 4 * INDEX_TOPK  # the top-k selection drops most of the context
    aggregated, _ = workers.engine(kv_fp8=fp8)
    prefill, _ = workers.engine("prefill", block_size=32, kv_fp8=fp8, kind=kind)
    decode, _ = workers.engine("decode", block_size=16, kv_fp8=fp8, kind=kind)
    per_token = decode.stats().kv_bytes_per_token
    pulled = 0
    for i, n in enumerate(LENGTHS):
        tokens = prompt(n, seed=10 + i)
        expected = run(aggregated, f"a{i}", tokens, MAX_TOKENS).result().output_token_ids
        params = prefilled(prefill, f"p{i}", tokens)
        assert params.remote_block_ids is not None
        assert len(params.remote_block_ids) == -(-n // 32)
        out = run(decode, f"d{i}", tokens, MAX_TOKENS, params).result()
        assert out.output_token_ids == expected, f"prompt of {n} tokens over {kind}, {kv} KV"
        pulled += (n - 1) * per_token  # every prompt token but the last, every row plane
        assert decode.stats().kv_pulled_bytes == pulled
        wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")
        wait_for(lambda: whole(decode), "the decode's pool to be whole")
    assert decode.stats().num_tokens_computed == len(LENGTHS) * MAX_TOKENS


def test_a_sparse_mla_decode_refuses_a_llama_prefill_with_a_clear_error(
    workers: Workers, tiny_checkpoint: Path
) -> None:
    llama = Workers(load_model(tiny_checkpoint, dtype=torch.float64))
    try:
        prefill, _ = llama.engine("prefill")
        decode, _ = workers.engine("decode", policy="fail")
        tokens = prompt(40, seed=7)
        params = prefilled(prefill, "p", tokens)
        result = run(decode, "d", tokens, MAX_TOKENS, params)
        error = result.outputs[-1].transfer_error
        assert error is not None and "paged head cache (llama-style" in error
        assert "latent cache (sparse-mla)" in error and not result.result().output_token_ids
        wait_for(lambda: whole(decode), "the decode's pool to be whole")
    finally:
        llama.close()


def test_mtp_over_pd_equals_aggregated_and_drafts_from_the_pulled_mtp_rows(
    workers: Workers,
) -> None:
    """Prefill and decode both speculate (k = 3): the MTP layer's rows of the prompt cross in
    the same blocks as the trunk's (32-token blocks into 16-token ones), and every draft the
    decode proposes equals the aggregated MTP engine's at the same position."""
    plain, _ = workers.engine()
    spies = RecordingDrafter(), RecordingDrafter()
    aggregated, _ = workers.engine(mtp_draft_tokens=3, drafter=spies[0])
    prefill, _ = workers.engine("prefill", block_size=32, mtp_draft_tokens=3)
    decode, _ = workers.engine("decode", block_size=16, mtp_draft_tokens=3, drafter=spies[1])
    spies[0].watch(aggregated)
    spies[1].watch(decode)
    for i, n in enumerate(LENGTHS):
        tokens = prompt(n, seed=20 + i)
        expected = run(plain, f"x{i}", tokens, MAX_TOKENS).result().output_token_ids
        assert run(aggregated, f"a{i}", tokens, MAX_TOKENS).result().output_token_ids == expected
        params = prefilled(prefill, f"p{i}", tokens)
        out = run(decode, f"d{i}", tokens, MAX_TOKENS, params).result()
        assert out.output_token_ids == expected, f"prompt of {n} tokens"
        assert spies[1].seen[f"d{i}"] == spies[0].seen[f"a{i}"]
        assert len(spies[1].seen[f"d{i}"]) == MAX_TOKENS - 2  # every decode step but the last
        wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")
        wait_for(lambda: whole(decode), "the decode's pool to be whole")


def test_an_mtp_decode_refuses_a_prefill_without_the_mtp_rows(workers: Workers) -> None:
    prefill, _ = workers.engine("prefill")
    decode, _ = workers.engine("decode", policy="fail", mtp_draft_tokens=3)
    tokens = prompt(40, seed=7)
    params = prefilled(prefill, "p", tokens)
    result = run(decode, "d", tokens, MAX_TOKENS, params)
    error = result.outputs[-1].transfer_error
    assert error is not None and not result.result().output_token_ids
    assert "num_layers 4 != 5" in error and "MTP setting" in error  # the MTP layer's rows
    wait_for(lambda: whole(decode), "the decode's pool to be whole")


HISPARSE_GIB = 0.01  # the host pool: the decode's 128 blocks of 16 tokens fit


def key_bytes_per_block(model: LoadedModel, block_size: int, fp8: Fp8Format | None) -> int:
    """Device bytes of one block's indexer keys (what `keys_arrived` copies per pulled block)."""
    latent = model.config.kv_spec(block_size, 1, torch.float64, fp8)
    assert isinstance(latent, LatentKVCacheSpec)
    return HiSparseSpec(latent, hot_slots=1, max_requests=1).device_bytes_per_block


@pytest.mark.parametrize("kv", list(FP8))
@pytest.mark.parametrize("kind", ["tcp", "nixl"])
def test_a_hisparse_decode_over_pd_equals_the_aggregated_engine(
    workers: Workers, sparse64: LoadedModel, kind: str, kv: str
) -> None:
    """A plain prefill (32-token blocks) feeds a HiSparse decode (16): pulls land in the host
    tier as stored bytes, the pulled blocks' keys are copied to the device, and the decode
    (hot buffers of 2 x top-k + 1 rows, smaller than the 150- and 300-token contexts) gives the
    aggregated no-HiSparse engine's greedy tokens."""
    fp8 = FP8[kv]
    aggregated, _ = workers.engine(kv_fp8=fp8)
    prefill, _ = workers.engine("prefill", block_size=32, kv_fp8=fp8, kind=kind)
    decode, _ = workers.engine(
        "decode", block_size=16, kv_fp8=fp8, kind=kind, hisparse_host_pool_gib=HISPARSE_GIB
    )
    per_token, keys_per_block = (
        decode.stats().kv_bytes_per_token,
        key_bytes_per_block(sparse64, 16, fp8),
    )
    pulled = keys = 0
    for i, n in enumerate(LENGTHS):
        tokens = prompt(n, seed=30 + i)
        expected = run(aggregated, f"a{i}", tokens, MAX_TOKENS).result().output_token_ids
        params = prefilled(prefill, f"p{i}", tokens)
        out = run(decode, f"d{i}", tokens, MAX_TOKENS, params).result()
        assert out.output_token_ids == expected, f"prompt of {n} tokens over {kind}, {kv} KV"
        pulled += (n - 1) * per_token  # every prompt token but the last, rows and keys
        keys += -(-(n - 1) // 16) * keys_per_block  # the pulled blocks' keys, to the device
        s = decode.stats()
        assert (s.kv_pulled_bytes, s.hisparse_keys_h2d_bytes) == (pulled, keys)
        wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")
        wait_for(lambda: whole(decode), "the decode's pool to be whole")
    s = decode.stats()
    assert s.hisparse_hot_misses > 0 and s.hisparse_h2d_bytes > 0  # the host path ran
    assert s.hisparse_hot_requests == 0  # every finish released its hot buffer
    assert s.num_tokens_computed == len(LENGTHS) * MAX_TOKENS


def test_a_hisparse_decode_copies_only_the_keys_of_blocks_past_its_prefix_hit(
    workers: Workers, sparse64: LoadedModel
) -> None:
    """A second prompt sharing 200 tokens with a pulled one hits 12 blocks in the decode's own
    prefix cache; only the blocks the pull then writes have their keys copied to the device."""
    aggregated, _ = workers.engine()
    prefill, _ = workers.engine("prefill", block_size=32)
    decode, _ = workers.engine("decode", block_size=16, hisparse_host_pool_gib=HISPARSE_GIB)
    first = prompt(300, seed=50)
    second = first[:200] + prompt(100, seed=51)
    per_block = key_bytes_per_block(sparse64, 16, None)
    for i, tokens in enumerate((first, second)):
        before = decode.stats()
        expected = run(aggregated, f"a{i}", tokens, MAX_TOKENS).result().output_token_ids
        params = prefilled(prefill, f"p{i}", tokens)
        out = run(decode, f"d{i}", tokens, MAX_TOKENS, params).result()
        assert out.output_token_ids == expected, f"prompt {i}"
        s = decode.stats()
        hit = s.prefix_hits - before.prefix_hits
        assert hit == (0 if i == 0 else 12 * 16)  # whole blocks of the shared 200 tokens
        copied = s.hisparse_keys_h2d_bytes - before.hisparse_keys_h2d_bytes
        assert copied == (-(-299 // 16) - hit // 16) * per_block
        wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")
        wait_for(lambda: whole(decode), "the decode's pool to be whole")


def test_a_hisparse_decode_with_kv_offload_reloads_its_prefix_and_pulls_the_rest(
    workers: Workers, sparse64: LoadedModel
) -> None:
    """The reference decode role: HiSparse beside CPU KV offload (`offloadGiB`). The host pool's
    evicted blocks go to the offload tier; a later pull of the same prompt reloads them into the
    host pool, pulls only what follows, and copies the keys of both to the device."""
    aggregated, _ = workers.engine()
    prefill, _ = workers.engine("prefill", block_size=32)
    decode, _ = workers.engine(
        "decode", num_blocks=64, kv_offload_gib=0.05, hisparse_host_pool_gib=HISPARSE_GIB
    )
    first, other = prompt(300, seed=60), prompt(900, seed=61)
    per_block = key_bytes_per_block(sparse64, 16, None)
    expected = run(aggregated, "a", first, MAX_TOKENS).result().output_token_ids
    for rid, tokens in (("d1", first), ("d2", other)):  # d2 evicts most of first's 64 blocks
        out = run(decode, rid, tokens, MAX_TOKENS, prefilled(prefill, f"{rid}-p", tokens))
        assert rid == "d2" or out.result().output_token_ids == expected
        wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")
    before = decode.stats()
    again = run(decode, "d3", first, MAX_TOKENS, prefilled(prefill, "d3-p", first)).result()
    assert again.output_token_ids == expected
    s = decode.stats()
    reloaded = s.kv_reload_tokens - before.kv_reload_tokens
    hit = s.prefix_hits - before.prefix_hits  # device-resident blocks: their keys are there
    assert reloaded > 0 and again.num_cached_tokens == hit + reloaded
    assert s.kv_pulled_tokens - before.kv_pulled_tokens == 299 - again.num_cached_tokens
    # keys to the device: the reloaded blocks' and the pulled blocks', none of the hits'
    copied = s.hisparse_keys_h2d_bytes - before.hisparse_keys_h2d_bytes
    assert copied == (-(-299 // 16) - hit // 16) * per_block
    wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")
    wait_for(lambda: whole(decode), "the decode's pool to be whole")


def test_a_hisparse_prefill_serves_a_plain_decode_from_its_host_tier(workers: Workers) -> None:
    """Writes keep the host tier's keys current, so a HiSparse engine in the prefill role
    serves whole latent blocks too (the decode sees the aggregated tokens)."""
    aggregated, _ = workers.engine()
    prefill, _ = workers.engine("prefill", block_size=32, hisparse_host_pool_gib=HISPARSE_GIB)
    decode, _ = workers.engine("decode", block_size=16)
    for i, n in enumerate((150, 300)):
        tokens = prompt(n, seed=40 + i)
        expected = run(aggregated, f"a{i}", tokens, MAX_TOKENS).result().output_token_ids
        params = prefilled(prefill, f"p{i}", tokens)
        out = run(decode, f"d{i}", tokens, MAX_TOKENS, params).result()
        assert out.output_token_ids == expected, f"prompt of {n} tokens"
        wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")
        wait_for(lambda: whole(decode), "the decode's pool to be whole")


@pytest.mark.parametrize("prefill_kv, decode_kv", [("plain", "fp8"), ("fp8", "plain")])
def test_a_hisparse_decode_refuses_a_prefill_of_another_layout(
    workers: Workers, prefill_kv: str, decode_kv: str
) -> None:
    prefill, _ = workers.engine("prefill", kv_fp8=FP8[prefill_kv])
    decode, _ = workers.engine(
        "decode", policy="fail", kv_fp8=FP8[decode_kv], hisparse_host_pool_gib=HISPARSE_GIB
    )
    tokens = prompt(40, seed=7)
    params = prefilled(prefill, "p", tokens)
    result = run(decode, "d", tokens, MAX_TOKENS, params)
    error = result.outputs[-1].transfer_error
    assert error is not None and not result.result().output_token_ids
    assert "hold different things" in error and "float8_e4m3fn" in error, error
    assert decode.stats().hisparse_keys_h2d_bytes == 0
    wait_for(lambda: whole(decode), "the decode's pool to be whole")
