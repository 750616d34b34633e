"""ParallelHooks: the sparse-mla LayerHooks of one forward on one rank: PCP gathers each layer's
new rows from the group and restores token order, the store keeps them (whole or DCP-sharded),
a sharded decode selects the global top-k and merges partial attention, EP runs the MoE;
BatchedHooks run several sequences' decode tokens as one forward.

Owns the per-forward wiring of those pieces; never allocates caches or samples tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from loom_runtime.models.sparse_mla.cache import LayerRows
from loom_runtime.models.sparse_mla.ffn import MoeFfn, SwiGluMlp
from loom_runtime.models.sparse_mla.indexer import Indexer, Selection
from loom_runtime.models.sparse_mla.mla import MlaAttention, Queries
from loom_runtime.models.sparse_mla.paged_hooks import select_per_sequence
from loom_runtime.models.sparse_mla.rotary import PairTables
from loom_runtime.parallel.collectives import all_gather_rows
from loom_runtime.parallel.sparse_mla.dcp_attention import (
    ShardSegment,
    global_top_k,
    merge_partials,
)
from loom_runtime.parallel.sparse_mla.ep_moe import ExpertParallelMoe
from loom_runtime.parallel.sparse_mla.plan import RankPlan
from loom_runtime.parallel.sparse_mla.store import FullStore, ShardStore


@dataclass(frozen=True)
class PcpSplit:
    """A forward's new tokens split over the PCP group (DualChunkSwap): rows per rank, and
    for each token in order the row of the rank-ordered gather that holds it."""

    counts: tuple[int, ...]
    restore: torch.Tensor  # [T] int64


class RankCompute:
    """Attention and FFN on a rank: `sharded`, attend over this rank's DCP shard and merge the
    partial outputs (decode), else over a whole copy of the rows; EP layers through `experts`."""

    def __init__(
        self,
        plan: RankPlan,
        sharded: bool = False,
        experts: Mapping[int, ExpertParallelMoe] | None = None,
    ) -> None:
        self.plan = plan
        self.sharded = sharded
        self.experts = experts or {}

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


class ParallelHooks(RankCompute):
    """One sequence's forward: `split`, its new tokens are spread over the PCP group."""

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
        super().__init__(plan, sharded, experts)
        self.store = store
        self.split = split

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
        store = self.store
        if not self.sharded or not isinstance(store, ShardStore):
            return indexer.select(h, q_resid, rope, keys, positions)
        whole = ShardSegment(slice(None), 0, store.key_positions, store.visible)
        return global_top_k(
            self.plan.dcp, store.shard, indexer, h, q_resid, rope, keys, positions, [whole]
        )

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


class BatchedHooks(RankCompute):
    """Several sequences' decode tokens in one forward: sequence i's new tokens are the rows
    `queries[i]` of it; each store keeps its own, and a layer's rows are every sequence's
    packed end to end (sequence i's from `starts[i]`), so one attention call and one FFN
    (one EP exchange) serve them all, while each query selects among its own sequence's rows."""

    def __init__(
        self,
        plan: RankPlan,
        stores: Sequence[FullStore | ShardStore],
        queries: Sequence[slice],
        experts: Mapping[int, ExpertParallelMoe] | None = None,
    ) -> None:
        sharded = plan.dcp.size > 1
        if sharded and not all(isinstance(s, ShardStore) for s in stores):
            raise ValueError("a DCP batch needs every sequence in a ShardStore")
        if len(stores) != len(queries):
            raise ValueError(f"{len(stores)} stores for {len(queries)} query spans")
        super().__init__(plan, sharded, experts)
        self.stores = list(stores)
        self.queries = list(queries)
        self.starts: list[int] = []
        self.lengths: list[int] = []

    def rows(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        parts = [
            store.keep(
                layer,
                latent[q],
                rope_keys[q],
                None if index_keys is None else index_keys[q],
                self.sharded,
            )
            for store, q in zip(self.stores, self.queries, strict=True)
        ]
        self.lengths = [int(p.latent.shape[0]) for p in parts]
        self.starts = [sum(self.lengths[:i]) for i in range(len(parts))]
        if len(parts) == 1:
            return parts[0]
        keys = [p.index_keys for p in parts if p.index_keys is not None]
        return LayerRows(
            latent=torch.cat([p.latent for p in parts]),
            rope_keys=torch.cat([p.rope_keys for p in parts]),
            index_keys=torch.cat(keys) if len(keys) == len(parts) else None,
        )

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
        if not self.sharded:
            bounds = [q.start for q in self.queries] + [self.queries[-1].stop]
            return select_per_sequence(
                indexer, bounds, self.starts, self.lengths, h, q_resid, rope, keys, positions
            )
        shards = self._shards()
        segments = [
            ShardSegment(q, start, store.key_positions, store.visible)
            for q, start, store in zip(self.queries, self.starts, shards, strict=True)
        ]
        shard = shards[0].shard
        return global_top_k(
            self.plan.dcp, shard, indexer, h, q_resid, rope, keys, positions, segments
        )

    def _shards(self) -> list[ShardStore]:
        return [s for s in self.stores if isinstance(s, ShardStore)]
