"""ParallelHooks: the sparse-mla LayerHooks of one forward on one rank: PCP gathers each layer's
new rows from the group and restores token order, the store keeps them (whole or DCP-sharded),
a sharded decode selects the global top-k and merges partial attention, EP runs the MoE.

Owns the per-forward wiring of those pieces; never allocates caches or samples tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from loom_runtime.models.sparse_mla.cache import LayerRows
from loom_runtime.models.sparse_mla.ffn import MoeFfn, SwiGluMlp
from loom_runtime.models.sparse_mla.indexer import Indexer, Selection
from loom_runtime.models.sparse_mla.mla import MlaAttention, Queries
from loom_runtime.models.sparse_mla.rotary import PairTables
from loom_runtime.parallel.collectives import all_gather_rows
from loom_runtime.parallel.sparse_mla.dcp_attention import global_top_k, merge_partials
from loom_runtime.parallel.sparse_mla.ep_moe import ExpertParallelMoe
from loom_runtime.parallel.sparse_mla.plan import RankPlan
from loom_runtime.parallel.sparse_mla.store import FullStore, ShardStore


@dataclass(frozen=True)
class PcpSplit:
    """A forward's new tokens split over the PCP group (DualChunkSwap): rows per rank, and
    for each token in order the row of the rank-ordered gather that holds it."""

    counts: tuple[int, ...]
    restore: torch.Tensor  # [T] int64


class ParallelHooks:
    """`sharded`: attend over this rank's DCP shard and merge (decode); otherwise attend over
    a whole copy of the rows (one rank, PCP, or DCP prefill's temporary copy)."""

    def __init__(
        self,
        plan: RankPlan,
        store: FullStore | ShardStore,
        split: PcpSplit | None = None,
        sharded: bool = False,
        experts: Mapping[int, ExpertParallelMoe] | None = None,
    ) -> None:
        if sharded and not isinstance(store, ShardStore):
            raise ValueError("sharded attention needs a DCP ShardStore")
        self.plan = plan
        self.store = store
        self.split = split
        self.sharded = sharded
        self.experts = experts or {}

    def rows(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        if self.split is not None:
            latent, rope_keys, index_keys = self._gather_new(latent, rope_keys, index_keys)
        return self.store.keep(layer, latent, rope_keys, index_keys, self.sharded)

    def select(
        self,
        indexer: Indexer,
        h: torch.Tensor,
        q_resid: torch.Tensor,
        rope: PairTables,
        rows: LayerRows,
        positions: torch.Tensor,
    ) -> Selection:
        keys = rows.indexer_keys()
        if not self.sharded or not isinstance(self.store, ShardStore):
            return indexer.select(h, q_resid, rope, keys, positions)
        store = self.store
        return global_top_k(
            self.plan.dcp,
            store.shard,
            indexer,
            h,
            q_resid,
            rope,
            keys,
            positions,
            store.key_positions,
            store.visible,
        )

    def attend(
        self, attention: MlaAttention, q: Queries, rows: LayerRows, selection: Selection
    ) -> torch.Tensor:
        if not self.sharded:
            return attention.attend(q, rows, selection)
        part = attention.partial(q, rows, selection)
        return attention.project(merge_partials(self.plan.dcp, part, self.plan.dcp_backend))

    def ffn(self, layer: int, ffn: MoeFfn | SwiGluMlp, h: torch.Tensor) -> torch.Tensor:
        shard = self.experts.get(layer)
        return ffn.forward(h) if shard is None else shard.forward(h)

    def _gather_new(
        self, latent: torch.Tensor, rope_keys: torch.Tensor, index_keys: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Every PCP rank's new rows, in token order."""
        assert self.split is not None
        parts = [latent, rope_keys] + ([] if index_keys is None else [index_keys])
        widths = [t.shape[1] for t in parts]
        gathered = all_gather_rows(self.plan.pcp, torch.cat(parts, dim=1), self.split.counts)
        whole = torch.split(torch.cat(gathered, dim=0)[self.split.restore], widths, dim=1)
        return whole[0], whole[1], whole[2] if len(whole) > 2 else None
