"""Hybrid HiSparse beside CPU KV offload (float64, greedy, tiny sparse-mla): the host pool's
evicted blocks go to the offload tier whole (rows and indexer keys) and a later prefix hit
reloads them into the host pool, then copies their keys to the device; the tokens are a plain
engine's (no HiSparse, no offload), on the copy thread and in the step, plain and fp8 KV, with
MTP speculation too (the reference decode role: HiSparse, offload, fp8 KV and MTP)."""

from __future__ import annotations

import pytest
import torch
from tests.runtime.engine.sparse_mla_helpers import Prompt, greedy

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import HiSparseKVCache
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK
from loom_runtime.wire.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    BlockRemoved,
    BlockStored,
    EventBuffer,
)

# 8 blocks of 16 tokens: one request of max_model_len 128 fills the pool, so the second prompt
# evicts most of the first one's cached blocks.
SMALL = {"dtype": torch.float64, "max_model_len": 128, "num_blocks": 8, "block_size": 16}


def host_pool_gib(loaded: LoadedModel, blocks: int) -> float:
    """A host pool of `blocks` whole float64 latent blocks of 16 tokens (fp8 ones are smaller)."""
    spec = loaded.config.kv_spec(16, 1, torch.float64)
    assert isinstance(spec, LatentKVCacheSpec)
    return blocks * spec.bytes_per_block / (1 << 30)


def engine_for(
    model: LoadedModel,
    fp8: Fp8Format | None,
    hisparse: bool,
    async_reload: bool = True,
    events: EventBuffer | None = None,
    mtp: int = 0,
) -> Engine:
    tiers = {
        "hisparse_host_pool_gib": host_pool_gib(model, 16),  # holds the 8 blocks, MTP rows too
        "hisparse_hot_slots": INDEX_TOPK + 1,  # smaller than a decode's working set: misses
        "kv_offload_gib": 0.01,
        "kv_reload_async": async_reload,
    }
    on = tiers if hisparse else {}
    config = EngineConfig(kv_fp8=fp8, mtp_draft_tokens=mtp, **SMALL, **on)  # type: ignore[arg-type]
    return Engine(model, config, events)


def tiers_of(engine: Engine) -> HiSparseKVCache:
    cache = engine._runner.cache
    assert isinstance(cache, HiSparseKVCache)
    return cache


def prefix_blocks(engine: Engine, prompt: tuple[int, ...]) -> torch.Tensor:
    """The pool's block ids of the prompt's cached full blocks, in order."""
    kv = engine._kv  # the test reads the blocks the engine holds
    hashes = kv.hasher.hash_blocks(prompt[: (len(prompt) - 1) // kv.block_size * kv.block_size])
    ids = kv.pool.lookup(hashes)
    assert len(ids) == len(hashes), "the prompt's blocks should be in the pool after its run"
    return torch.tensor(ids)


@pytest.mark.parametrize(
    ("async_reload", "fp8", "mtp"),
    [(True, False, 0), (False, False, 0), (True, True, 0), (False, True, 0), (True, True, 3),
     (False, False, 3)],
    ids=["copy-thread", "in-step", "fp8-copy-thread", "fp8-in-step", "fp8-mtp", "mtp-in-step"],
)  # fmt: skip
def test_hisparse_offload_reload_equals_a_plain_engine(
    sparse64: LoadedModel, prompt: Prompt, async_reload: bool, fp8: bool, mtp: int
) -> None:
    kv_fp8 = Fp8Format(16) if fp8 else None
    events = EventBuffer()
    engine = engine_for(sparse64, kv_fp8, True, async_reload, events, mtp)
    plain = engine_for(sparse64, kv_fp8, hisparse=False, mtp=mtp)  # MTP drafts the same way
    tiers = tiers_of(engine)
    first, other = prompt(81, 1), prompt(100, 2)

    got = [engine.generate(first, greedy(8))]
    written = tiers.host.data[prefix_blocks(engine, first)].clone()  # rows and keys, as stored
    keys_before = tiers.counters.keys_h2d_bytes
    got += [engine.generate(p, greedy(8)) for p in (other, first)]
    want = [plain.generate(p, greedy(8)) for p in (first, other, first)]

    assert [r.output_token_ids for r in got] == [r.output_token_ids for r in want]
    stats = engine.stats()
    assert stats.kv_offloaded_blocks > 0 and stats.kv_reload_tokens > 0
    assert stats.hisparse_hot_misses > 0  # the decode read rows from the host pool
    assert not mtp or (stats.spec is not None and stats.spec.num_drafts > 0)  # MTP drafted
    # the offload tier's blocks are the host pool's: whole latent blocks, keys included
    assert engine._offload is not None
    assert engine._offload.host.block_bytes == tiers.spec.host_bytes_per_block
    assert stats.kv_reload_bytes == stats.kv_reload_tokens // 16 * tiers.spec.host_bytes_per_block
    # the reloaded tokens were not run through the model again (with MTP a hit run gives up its
    # last block: the plain engine's one device-resident block, here the last reloaded one)
    saved = got[2].num_cached_tokens - want[2].num_cached_tokens
    assert saved == stats.kv_reload_tokens + (16 if mtp else 0)
    assert plain.tokens_run - engine.tokens_run == saved
    # bit for bit: the host pool holds again what the first turn wrote in the blocks the third
    # turn did not compute (kept or reloaded); MTP's given-up block was recomputed in another
    # chunk, which moves the last float64 bits only
    ids, kept = prefix_blocks(engine, first), got[2].num_cached_tokens // 16
    assert torch.equal(tiers.host.data[ids[:kept]], written[:kept])
    torch.testing.assert_close(tiers.host.data[ids], written, rtol=0, atol=1e-12)
    # ... and the device's key copies of the reloaded blocks are the host pool's keys
    assert torch.equal(tiers.index_rows[ids], tiers.host.index_rows[ids])
    reloaded = stats.kv_reload_tokens // 16
    key_bytes = tiers.spec.device_bytes_per_block
    assert tiers.counters.keys_h2d_bytes - keys_before == reloaded * key_bytes
    engine._pool.assert_whole()
    assert tiers.hot_requests == 0
    # the offload tier announces itself as before: medium CPU, every evicted cached block
    taken = events.take()
    stored_cpu = {h for e in taken if isinstance(e, BlockStored) and e.medium == MEDIUM_CPU
                  for h in e.block_hashes}  # fmt: skip
    removed_gpu = {h for e in taken if isinstance(e, BlockRemoved) and e.medium == MEDIUM_GPU
                   for h in e.block_hashes}  # fmt: skip
    assert stored_cpu and stored_cpu == removed_gpu
