"""The engine side of Hybrid HiSparse decode: the two-tier latent cache sized from the engine's
config (blocks counted in the host pool), and the figures it reports.

Owns that sizing and those figures; never runs a forward or frees blocks (the loop does).
"""

from __future__ import annotations

import torch

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.mtp_runner import mtp_kv_spec
from loom_runtime.kv.cache import KVSpec
from loom_runtime.kv.hisparse_cache import HiSparseKVCache, default_hot_slots, plan_hisparse
from loom_runtime.kv.latent_cache import LatentKVCacheSpec
from loom_runtime.models.causal_lm import DecoderConfig


def hisparse_cache(
    model: DecoderConfig, config: EngineConfig, max_model_len: int, device: torch.device | str
) -> HiSparseKVCache:
    """The tiers for `model`: the block pool is as many blocks as `hisparse_host_pool_gib`
    holds (or `num_blocks`), the device holds their indexer keys and `max_num_seqs` hot buffers
    (within `kv_cache_bytes` when given); ValueError for a model without latent rows."""
    latent: KVSpec
    if config.mtp_draft_tokens:  # the MTP layer's rows are one more layer of both tiers
        latent = mtp_kv_spec(model, config.block_size, 1, config.dtype, config.kv_fp8)
    else:
        latent = model.kv_spec(config.block_size, 1, config.dtype, config.kv_fp8)
    topk = getattr(model, "index_topk", None)
    if not isinstance(latent, LatentKVCacheSpec) or not isinstance(topk, int):
        raise ValueError(
            f"HiSparse (hisparse_host_pool_gib) needs a sparse-mla model; {model.model_type} "
            "has no latent rows and no indexer: set hisparse_host_pool_gib 0"
        )
    spec = plan_hisparse(
        latent,
        host_pool_bytes=config.hisparse_host_pool_bytes,
        hot_slots=config.hisparse_hot_slots or default_hot_slots(topk),
        max_requests=config.max_num_seqs,
        min_blocks=-(-max_model_len // config.block_size),
        num_blocks=config.num_blocks,
        device_budget=config.kv_cache_bytes,
    )
    return spec.allocate(device)


def hisparse_stats(cache: HiSparseKVCache) -> dict[str, int]:
    """The HiSparse fields of EngineStats."""
    c = cache.counters
    return {
        "hisparse_host_pool_bytes": cache.host.data.nbytes,
        "hisparse_hot_hits": c.hits,
        "hisparse_hot_misses": c.misses,
        "hisparse_resident_rows": c.resident,
        "hisparse_h2d_bytes": c.h2d_bytes,
        "hisparse_prefill_h2d_bytes": c.prefill_h2d_bytes,
        "hisparse_keys_h2d_bytes": c.keys_h2d_bytes,
        "hisparse_hot_requests": cache.hot_requests,
    }
