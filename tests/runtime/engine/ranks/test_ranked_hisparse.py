"""Hybrid HiSparse on DP2×EP2 gloo ranks (the reference decode's shape): each rank keeps its
requests' rows in a host tier, their indexer keys on the device and a hot buffer per layer,
and attends over the selected rows only. Concurrent chunked requests give the one-rank
engine's greedy tokens (index top-k 64 below the contexts; a hot buffer of top-k + 1 slots,
so decodes both hit and miss); the block pool is what the host pool holds; the tier counters
are the engine's HiSparse figures and each rank reports its device bytes; the pool counts both
ranks' host pools; HiSparse with PCP or DCP is refused before any rank starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.runtime.engine.ranks_config import ranks_config
from tests.runtime.engine.sparse_mla_helpers import Prompt, greedy, inner, one_sequence

from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.ranks.ranked_runner import RankedRunner
from loom_runtime.engine.types import EngineRequest, RankKVStats
from loom_runtime.kv.hisparse_cache import plan_hisparse
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK
from loom_runtime.parallel.layout import ParallelLayout

HOST_GIB = 0.004  # a few MiB: about 130 blocks of the tiny float64 model
DP2_EP2 = ParallelLayout(dp=2, ep=2)


def config(layout: ParallelLayout = DP2_EP2, **kw: object) -> EngineConfig:
    tiers = dict(hisparse_host_pool_gib=HOST_GIB, hisparse_hot_slots=INDEX_TOPK + 1)
    return ranks_config(layout, num_blocks=None, **(tiers | kw))


def test_concurrent_requests_on_hisparse_ranks_equal_one_rank(
    sparse_dir: Path, sparse64: LoadedModel, prompt: Prompt
) -> None:
    lengths = [5, 70, 130, 260]  # one below top-k; > 96 tokens (one step's chunk) from 130 on
    reqs = [EngineRequest(f"r{i}", prompt(n, 900 + i), greedy(16)) for i, n in enumerate(lengths)]
    got = {r.request_id: OutputCollector(r) for r in reqs}
    cfg = config()
    engine = Engine.from_checkpoint(sparse_dir, cfg)
    try:
        for r in reqs:
            engine.add_request(r, got[r.request_id])
        held: tuple[RankKVStats, ...] = ()
        while not all(c.done.is_set() for c in got.values()):
            engine.step()
            ranks = engine.stats().ranks
            if sum(r.sequences for r in ranks) == len(reqs):
                held = ranks
        assert isinstance(engine._runner, RankedRunner)
        engine._runner.flush()  # the last releases
        stats = engine.stats()
    finally:
        engine.shutdown()
    for r in reqs:
        want = one_sequence(inner(sparse64), r.prompt_token_ids, 16)
        assert got[r.request_id].result().output_token_ids == want
    # the pool holds what the two ranks' host pools do, each as one rank's HiSparse counts it
    spec = sparse64.config.kv_spec(cfg.block_size, 1, cfg.dtype, None)
    assert isinstance(spec, LatentKVCacheSpec)
    host = plan_hisparse(spec, cfg.hisparse_host_pool_bytes, INDEX_TOPK + 1, 8, 32)
    assert stats.num_blocks == 2 * host.num_blocks
    assert stats.hisparse_host_pool_bytes == 2 * cfg.hisparse_host_pool_bytes
    # the engine's mirror of the ranks' rows is host memory, not a device pool
    assert stats.kv_cache_bytes == 0
    assert stats.hisparse_hot_hits > 0 and stats.hisparse_hot_misses > 0
    assert stats.hisparse_h2d_bytes > 0 and stats.hisparse_prefill_h2d_bytes > 0
    assert [r.sequences for r in held] == [2, 2]
    assert all(rank.device_kv_bytes > 0 for rank in held)  # keys and hot rows on the device
    assert all(rank.sequences == 0 and rank.device_kv_bytes == 0 for rank in stats.ranks)


def test_hisparse_with_pcp_or_dcp_is_refused(sparse_dir: Path) -> None:
    for layout in (ParallelLayout(pcp=2, dcp=2), ParallelLayout(pcp=2, ep=2)):
        with pytest.raises(ValueError, match="HiSparse on ranks runs on DP × EP ranks"):
            config(layout)
