"""The engine side of Hybrid HiSparse decode: the two-tier latent cache sized from the engine's
config (blocks counted in the host pool), the hot buffers' size, and the figures it reports;
on DP × EP ranks the ranks hold the tiers (parallel/sparse_mla/tiered_store.py) and the engine
counts the same blocks and sums their figures.

Owns that sizing and those figures; never runs a forward or frees blocks (the loop does).
"""

from __future__ import annotations

import torch

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.ranks.channel import EngineRanks
from loom_runtime.engine.ranks.ranked_runner import RankedRunner
from loom_runtime.engine.spec.mtp_runner import mtp_kv_spec
from loom_runtime.kv.cache import KVSpec
from loom_runtime.kv.hisparse_cache import (
    HiSparseKVCache,
    HiSparseSpec,
    TierCounters,
    default_hot_slots,
    plan_hisparse,
)
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.causal_lm import DecoderConfig


def hot_slots(model: DecoderConfig, config: EngineConfig) -> int:
    """Rows per layer of a request's hot buffer: as configured, else 2 × top-k + 1."""
    topk = getattr(model, "index_topk", None)
    if not isinstance(topk, int):
        raise ValueError(
            f"HiSparse (hisparse_host_pool_gib) needs a sparse-mla model; {model.model_type} "
            "has no latent rows and no indexer: set hisparse_host_pool_gib 0"
        )
    return config.hisparse_hot_slots or default_hot_slots(topk)


def hisparse_spec(
    model: DecoderConfig, config: EngineConfig, max_model_len: int, ranked: bool = False
) -> HiSparseSpec:
    """The tiers for `model`: as many blocks as `hisparse_host_pool_gib` holds (or
    `num_blocks`), the device their indexer keys and `max_num_seqs` hot buffers (within
    `kv_cache_bytes` when given, on one rank; `ranked`: the ranks hold the tiers, each its own
    requests'); ValueError for a model without latent rows."""
    slots = hot_slots(model, config)
    latent: KVSpec
    if config.mtp_draft_tokens:  # the MTP layer's rows are one more layer of both tiers
        latent = mtp_kv_spec(model, config.block_size, 1, config.dtype, config.kv_fp8)
    else:
        latent = model.kv_spec(config.block_size, 1, config.dtype, config.kv_fp8)
    if not isinstance(latent, LatentKVCacheSpec):
        raise ValueError(f"HiSparse needs latent rows; {model.model_type} has none")
    return plan_hisparse(
        latent,
        host_pool_bytes=config.hisparse_host_pool_bytes,
        hot_slots=slots,
        max_requests=config.max_num_seqs,
        min_blocks=-(-max_model_len // config.block_size),
        num_blocks=config.num_blocks,
        device_budget=None if ranked else config.kv_cache_bytes,
    )


def hisparse_cache(
    model: DecoderConfig, config: EngineConfig, max_model_len: int, device: torch.device | str
) -> HiSparseKVCache:
    """The one-rank engine's tiers (hisparse_spec), allocated."""
    return hisparse_spec(model, config, max_model_len).allocate(device)


def hisparse_stats(
    cache: HiSparseKVCache | None, ranks: EngineRanks | None, config: EngineConfig
) -> dict[str, int]:
    """The HiSparse fields of EngineStats: the engine's own tiers', or its HiSparse ranks'
    summed (the host pool then is the DP replicas' pools together); none when off."""
    if cache is not None:
        return _fields(cache.counters, cache.host.data.nbytes, cache.hot_requests)
    tiers = ranks.tiers() if isinstance(ranks, RankedRunner) else None
    if tiers is None or ranks is None:
        return {}
    live = sum(r.sequences for r in ranks.kv())
    return _fields(tiers, config.hisparse_host_pool_bytes * config.parallel.dp, live)


def _fields(c: TierCounters, host_bytes: int, hot_requests: int) -> dict[str, int]:
    return {
        "hisparse_host_pool_bytes": host_bytes,
        "hisparse_hot_hits": c.hits,
        "hisparse_hot_misses": c.misses,
        "hisparse_resident_rows": c.resident,
        "hisparse_h2d_bytes": c.h2d_bytes,
        "hisparse_prefill_h2d_bytes": c.prefill_h2d_bytes,
        "hisparse_keys_h2d_bytes": c.keys_h2d_bytes,
        "hisparse_hot_requests": hot_requests,
    }
