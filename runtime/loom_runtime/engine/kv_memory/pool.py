"""The KV memory an engine runs on: which family's paged cache (the MTP layer's rows added
when speculating), HiSparse's two tiers, or a parallel engine's pool (a block count, or a mirror
of its ranks' rows), and the figures `/metrics` reports about it.

Owns that choice and its sizing, once, at construction, its CPU offload tier and the
offload's figures; never allocates blocks to requests
(the block pool does) and never runs a forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.kv_memory.hisparse import hisparse_cache, hisparse_spec
from loom_runtime.engine.ranks.channel import EngineRanks
from loom_runtime.engine.spec.mtp_runner import mtp_kv_spec
from loom_runtime.errors import TransferError
from loom_runtime.kv.cache import KVSpec, KVStore
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import HiSparseKVCache
from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.kv.offload import KVOffload
from loom_runtime.models.causal_lm import DecoderConfig
from loom_runtime.wire.kv_events import KVEventSink


@dataclass(frozen=True)
class EngineKV:
    """`cache` (HiSparse's tiers when `hisparse` is set), its block count, its device bytes
    (HiSparse: keys and hot buffers; ranks that keep their rows themselves: 0, see
    EngineStats.ranks) and the KV bytes one token costs (the planner's figure). On DP ranks
    each attention replica holds `replica_blocks[d]` of the blocks (empty: one pool)."""

    cache: KVStore
    num_blocks: int
    hisparse: HiSparseKVCache | None
    device_bytes: int
    bytes_per_token: int
    replica_blocks: tuple[int, ...] = ()


def engine_kv(
    mc: DecoderConfig,
    config: EngineConfig,
    max_model_len: int,
    model_device: torch.device,
    ranks: EngineRanks | None,
    pd_role: bool,
) -> EngineKV:
    """The cache an engine of `mc` under `config` runs on (`model_device`: where its own model
    lives; a parallel engine's is the meta device). A P/D role's cache must be transferable.
    On DP ranks the capacity a config gives (num_blocks, kv_cache_bytes, a HiSparse host pool)
    is each replica's, as a role's resources are each rank's: the pool counts all of theirs."""
    bs = config.block_size
    kv_spec = mtp_kv_spec if config.mtp_draft_tokens else _family_spec
    per_block = kv_spec(mc, bs, 1, config.dtype, config.kv_fp8).bytes_per_block
    hisparse: HiSparseKVCache | None = None
    cache: KVStore
    replica_blocks: tuple[int, ...] = ()
    if config.hisparse and ranks is None:
        cache = hisparse = hisparse_cache(mc, config, max_model_len, model_device)
        num_blocks = cache.spec.num_blocks
    else:
        chosen = None if ranks is None else ranks.num_blocks  # TP ranks' pools: the same size
        if config.hisparse:  # HiSparse ranks hold the tiers: the pool counts the host pool's
            chosen = hisparse_spec(mc, config, max_model_len, ranked=True).num_blocks
        num_blocks = chosen or config.resolve_num_blocks(per_block, max_model_len)
        dp = config.parallel.dp if ranks is not None else 1
        replica_blocks = (num_blocks,) * dp if dp > 1 else ()
        num_blocks *= dp
        spec = kv_spec(mc, bs, num_blocks, config.dtype, config.kv_fp8)
        # a parallel engine's rows live on its ranks: its pool only counts blocks, unless its
        # ranks export their rows (prefix caching, P/D): then the pool mirrors them
        mirrored = ranks is not None and ranks.export_rows
        # HiSparse ranks keep their rows in host tiers: their mirror is host memory too (as a
        # one-rank engine's pulls land in its host pool), never the device's
        where = model_device
        if ranks is not None:
            where = torch.device("cpu" if config.hisparse else config.device)
        counted = ranks is not None and not mirrored
        cache = spec.allocate(torch.device("meta") if counted else where)
        if mirrored and ranks is not None:
            assert isinstance(cache, LatentKVCache)  # check_ranks: sparse-mla only
            ranks.mirror_into(cache)
    if pd_role and not cache.transferable:
        raise TransferError(
            f"P/D serving moves paged head caches and sparse-mla latent caches; the "
            f"{mc.model_type} model's {type(cache).__name__} cannot be transferred yet: "
            "serve it with an aggregated role"
        )
    if ranks is not None and (not ranks.export_rows or config.hisparse):
        device_bytes = 0  # the ranks' rows (or host tiers): EngineStats.ranks reports them
    elif hisparse is not None:
        device_bytes = hisparse.spec.device_bytes
    else:
        device_bytes = cache.data.nbytes
    return EngineKV(cache, num_blocks, hisparse, device_bytes, per_block // bs, replica_blocks)


def kv_offload(kv: EngineKV, config: EngineConfig, events: KVEventSink | None) -> KVOffload | None:
    """CPU KV offload of the pool's blocks (None: off). Under HiSparse the blocks' bytes are
    the host tier's (rows and keys; the device holds only key copies), so those are what is
    offloaded and reloaded, and a reload then copies the blocks' keys to the device."""
    if config.kv_offload_bytes <= 0:
        return None
    bs, h = config.block_size, kv.hisparse
    if h is None:
        return KVOffload(kv.cache.data, config.kv_offload_bytes, bs, events)
    return KVOffload(h.host.data, config.kv_offload_bytes, bs, events, h.keys_arrived)


def offload_stats(offload: KVOffload | None) -> dict[str, int]:
    """The CPU KV offload fields of EngineStats (none when offload is off)."""
    if offload is None:
        return {}
    o = offload.stats()
    return {
        "kv_offload_capacity_bytes": o.host.capacity_bytes,
        "kv_offload_used_bytes": o.host.used_bytes,
        "kv_offloaded_blocks": o.offloaded_blocks,
        "kv_reload_tokens": o.reload_tokens,
        "kv_reload_bytes": o.reload_bytes,
    }


def _family_spec(
    mc: DecoderConfig, block_size: int, num_blocks: int, dtype: torch.dtype, fp8: Fp8Format | None
) -> KVSpec:
    """The family's own paged cache (MTP speculation adds its layer: mtp_runner.mtp_kv_spec)."""
    return mc.kv_spec(block_size, num_blocks, dtype, fp8)
