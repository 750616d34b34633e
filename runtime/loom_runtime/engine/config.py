"""EngineConfig: the engine's typed settings, each default documented next to its field.

A frozen record built once (from a card or the CLI); never read from the environment here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.parallel.layout import ParallelLayout

DCP_BACKENDS = ("ag_rs", "a2a")  # vLLM's --dcp-comm-backend choices


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block (must match the router's prefix index)
    # KV capacity: give num_blocks or kv_cache_gib (a role's engine.kvCacheGiB), not both. With
    # neither, the engine sizes the cache for max_num_seqs requests at a quarter of max_model_len
    # each (see resolve_num_blocks), and never below one request of max_model_len.
    num_blocks: int | None = None
    kv_cache_gib: float | None = None
    max_num_seqs: int = 64  # requests running at once (decode batch width)
    max_num_batched_tokens: int = 2048  # token budget of one step (prefill chunks + decodes)
    max_model_len: int | None = None  # prompt + output limit; None: max_position_embeddings
    dtype: torch.dtype = torch.float32  # weights, activations and KV (unless kv_fp8)
    # None: the KV cache is stored in `dtype`. Else (a card's `precision.kv: fp8`) it stores e4m3
    # values with an fp32 scale per group of this format (docs/fp8-kv.md); compute stays `dtype`.
    kv_fp8: Fp8Format | None = None
    # Keep computed KV blocks for later requests with the same prefix (a role's
    # engine.prefixCaching, `--no-prefix-caching` turns it off). False: every prompt is
    # recomputed, and a parallel engine keeps no mirror of its ranks' rows (docs/parallel.md).
    prefix_caching: bool = True
    # CPU KV offload (a role's kvOffload.hostGiB, `--kv-offload-gib`): GiB of host memory that
    # keeps cached blocks the device pool evicts, reloaded on a later prefix hit instead of
    # recomputed (docs/kv-offload.md). 0: off. Needs prefix_caching. Under HiSparse (a decode
    # role's hiSparse.offloadGiB) it keeps the host pool's evicted blocks (docs/hisparse.md).
    kv_offload_gib: float = 0.0
    # Batch-invariant mode (`--batch-invariant`; models/linear.py, models/invariant_attention.py):
    # a request's results do not change in their last bits with what shares its step nor with
    # how its prompt is chunked or cached, at a cost in compute. The llama, sparse-mla and mot
    # families in one process or on TP ranks (not PCP/DCP/EP/DP), not with HiSparse or MTP.
    batch_invariant: bool = False
    # True: a request's host-tier prefix is copied in on a copy thread while the step loop goes
    # on (the request waits, holding its blocks); False: inside the step that admits it.
    kv_reload_async: bool = True
    # Hybrid HiSparse decode (a decode role's hiSparse.hostPoolGiB, `--hisparse-host-pool-gib`;
    # sparse-mla only): GiB of host memory holding every KV block's latent + RoPE rows; the
    # device keeps only the indexer keys and a hot buffer per running request, so the host pool,
    # not device memory, bounds how many blocks (and requests) fit (docs/hisparse.md). 0: off.
    hisparse_host_pool_gib: float = 0.0
    # Rows per layer in a request's hot buffer; None: 2 × the indexer's top-k + 1.
    hisparse_hot_slots: int | None = None
    # Ranks inside the engine (a role's `parallelism`, `--tp`, `--pcp/--dcp/--ep/--dcp-interleave`):
    # the forward runs on layout.world rank processes that the engine drives step by step
    # (docs/parallel.md). Sparse-mla splits over PCP, DCP and EP, or over DP replicas whose
    # attention runs each on its own requests while EP spans them (engine/ranks/ranked_runner.py):
    # the ranks keep each request's rows themselves; the engine's
    # pool mirrors them for prefix caching (and its CPU offload tier) and a P/D prefill's
    # connector (a decode's pull lands there and seeds the ranks). The llama family splits over
    # TP alone (engine/ranks/tp_runner.py): each rank keeps its kv heads' pool, indexed by the
    # engine's block tables; no P/D or CPU offload there yet. HiSparse runs on DP x EP ranks
    # (each rank holds its requests' tiers: parallel/sparse_mla/tiered_store.py). On DP ranks
    # num_blocks, kv_cache_bytes and the HiSparse host pool are each replica's: the engine's
    # pool counts dp of them and the scheduler keeps each replica within its own.
    parallel: ParallelLayout = field(default_factory=ParallelLayout)
    dcp_backend: Literal["ag_rs", "a2a"] = "ag_rs"  # how DCP merges partial attention
    collective_timeout_s: float = 60.0  # no rank waits longer on a collective or a step
    # MTP speculative decoding (a role's mtp.draftTokens, `--mtp-draft-tokens`; sparse-mla with
    # MTP layers, aggregated role, no HiSparse): tokens the MTP layer drafts per verify row. 0:
    # off. The engine checks it against the model at construction (engine/spec/check.py).
    mtp_draft_tokens: int = 0
    prefix_hash_seed: str = "0"  # NONE_HASH seed; the router must use the same
    weights_version: str = "v1"
    model_name: str = "loom"
    device: str = "cpu"
    max_waiting: int = 4096  # bound of the waiting queue; beyond it add_request is refused
    idle_wait_s: float = 0.05  # how long an idle step thread sleeps on its condition per wait

    def __post_init__(self) -> None:
        positive = {
            "block_size": self.block_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_waiting": self.max_waiting,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {value}")
        if self.num_blocks is not None and self.kv_cache_gib is not None:
            raise ValueError("EngineConfig: set num_blocks or kv_cache_gib, not both")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"EngineConfig.num_blocks must be >= 1, got {self.num_blocks}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ValueError(f"EngineConfig.kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"EngineConfig.max_model_len must be >= 2, got {self.max_model_len}")
        if not self.kv_offload_gib >= 0:  # also refuses NaN
            raise ValueError(
                f"EngineConfig.kv_offload_gib must be >= 0 (GiB of host memory for offloaded KV "
                f"blocks; 0 turns CPU KV offload off), got {self.kv_offload_gib}"
            )
        if self.kv_offload_gib > 0 and not self.prefix_caching:
            raise ValueError(
                "EngineConfig.kv_offload_gib needs prefix_caching: offloaded blocks are found "
                "again by their prefix hash; enable prefix caching or set kv_offload_gib 0"
            )
        if not self.hisparse_host_pool_gib >= 0:
            raise ValueError(
                f"EngineConfig.hisparse_host_pool_gib must be >= 0 (GiB of host memory for the "
                f"HiSparse host pool; 0 turns HiSparse off), got {self.hisparse_host_pool_gib}"
            )
        if self.hisparse_hot_slots is not None and self.hisparse_hot_slots < 1:
            raise ValueError(
                f"EngineConfig.hisparse_hot_slots must be >= 1, got {self.hisparse_hot_slots}"
            )
        self._check_parallel()
        if self.mtp_draft_tokens < 0:
            raise ValueError(
                f"EngineConfig.mtp_draft_tokens must be >= 0 (tokens the MTP layer drafts per "
                f"step; 0 turns MTP speculation off), got {self.mtp_draft_tokens}"
            )
        if self.idle_wait_s <= 0:
            raise ValueError(f"EngineConfig.idle_wait_s must be > 0, got {self.idle_wait_s}")
        features = (("HiSparse", self.hisparse), ("MTP speculation", self.mtp_draft_tokens > 0))
        beside = [name for name, on in features if on]
        if self.batch_invariant and beside:
            raise ValueError(
                f"EngineConfig.batch_invariant is not built with {' or '.join(beside)}: their "
                "steps still round a request by what shares them; turn one of them off"
            )

    def _check_parallel(self) -> None:
        layout = self.parallel
        if self.dcp_backend not in DCP_BACKENDS:
            raise ValueError(
                f"EngineConfig.dcp_backend must be one of {DCP_BACKENDS}, got {self.dcp_backend!r}"
            )
        if not self.collective_timeout_s > 0:
            raise ValueError(
                f"EngineConfig.collective_timeout_s must be > 0, got {self.collective_timeout_s}"
            )
        if layout.world == 1:
            return
        if layout.tp > 1 and layout.tp != layout.world:
            raise ValueError(
                f"EngineConfig.parallel {layout.describe()}: tp combines with no other split "
                "in the native runtime (tp for the llama family; pcp, dcp and ep for sparse-mla)"
            )
        if self.hisparse and layout.world != layout.dp:
            raise ValueError(
                f"EngineConfig.parallel {layout.describe()}: HiSparse on ranks runs on DP × EP "
                "ranks (the reference decode's shape: each rank an attention replica holding "
                "its requests' tiers); with pcp, dcp or tp it is not built: set "
                "hisparse_host_pool_gib 0 or use dp and ep"
            )

    @property
    def use_prefix_cache(self) -> bool:
        """Prefix caching as asked (a parallel engine's pool then mirrors its ranks' rows, and a
        prefix hit seeds the ranks' new sequence from it: engine/ranks/ranked_runner.py)."""
        return self.prefix_caching

    @property
    def kv_offload_bytes(self) -> int:
        return int(self.kv_offload_gib * (1 << 30))

    @property
    def hisparse(self) -> bool:
        return self.hisparse_host_pool_gib > 0

    @property
    def hisparse_host_pool_bytes(self) -> int:
        return int(self.hisparse_host_pool_gib * (1 << 30))

    def resolve_max_model_len(self, max_position_embeddings: int) -> int:
        if self.max_model_len is None:
            return max_position_embeddings
        if self.max_model_len > max_position_embeddings:
            raise ValueError(
                f"EngineConfig.max_model_len {self.max_model_len} exceeds the model's "
                f"max_position_embeddings {max_position_embeddings}"
            )
        return self.max_model_len

    @property
    def kv_cache_bytes(self) -> int | None:
        """kv_cache_gib in bytes (None: not given)."""
        return None if self.kv_cache_gib is None else int(self.kv_cache_gib * 2**30)

    def resolve_num_blocks(self, bytes_per_block: int, max_model_len: int) -> int:
        """KV blocks to allocate; at least enough for one request of max_model_len."""
        one_request = -(-max_model_len // self.block_size)
        if self.num_blocks is not None:
            blocks = self.num_blocks
        elif self.kv_cache_bytes is not None:
            blocks = self.kv_cache_bytes // bytes_per_block
        else:
            tokens = self.max_num_seqs * max_model_len // 4
            blocks = max(one_request, -(-tokens // self.block_size))
        if blocks < one_request:
            raise ValueError(
                f"EngineConfig: {blocks} KV blocks of {self.block_size} tokens cannot hold one "
                f"request of max_model_len {max_model_len} (needs {one_request}); add KV "
                "capacity or lower max_model_len"
            )
        return blocks
