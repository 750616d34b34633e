"""TieredHooks: the sparse-mla LayerHooks of one forward on a Hybrid HiSparse rank (no PCP, no
DCP: a DP replica, the reference decode's shape): the sequences' rows stay in their host
tiers, selection scores the device keys, and attention reads only the selected rows; EP runs
the MoE as on any rank.

Owns the per-forward wiring of those pieces; never allocates tiers or samples tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from loom_runtime.models.sparse_mla.cache import LayerRows
from loom_runtime.models.sparse_mla.indexer import Selection
from loom_runtime.models.sparse_mla.mla import MlaAttention, Queries
from loom_runtime.models.sparse_mla.selected_rows import attend_selected
from loom_runtime.parallel.sparse_mla.ep_moe import ExpertParallelMoe
from loom_runtime.parallel.sparse_mla.hooks import BatchedHooks
from loom_runtime.parallel.sparse_mla.plan import RankPlan
from loom_runtime.parallel.sparse_mla.tiered_store import TieredStore


class TieredHooks(BatchedHooks):
    """Several sequences' tokens in one forward (one sequence: a batch of one): sequence i's
    new tokens are the rows `queries[i]`. A layer's rows are the step's new rows and every
    sequence's device keys packed end to end (sequence i's from `starts[i]`), so selection is
    BatchedHooks'; a query's selected earlier rows come through its sequence's hot buffer in a
    one-token forward (a decode, a draft), or are copied for the step in a wider one (a prompt
    chunk, a verify)."""

    def __init__(
        self,
        plan: RankPlan,
        stores: Sequence[TieredStore],
        queries: Sequence[slice],
        experts: Mapping[int, ExpertParallelMoe] | None = None,
    ) -> None:
        if plan.pcp.size > 1 or plan.dcp.size > 1:
            raise ValueError("HiSparse ranks run without PCP and DCP (a DP replica, or EP)")
        super().__init__(plan, stores, queries, experts)
        self.tiered = list(stores)
        self._layer = -1

    def rows(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        rows = super().rows(layer, latent, rope_keys, index_keys)
        self._layer = layer
        # the contexts' lengths: each store handed over its new rows only, and its keys
        self.lengths = [store.visible for store in self.tiered]
        self.starts = [sum(self.lengths[:i]) for i in range(len(self.lengths))]
        return rows

    def attend(
        self, attention: MlaAttention, q: Queries, rows: LayerRows, selection: Selection
    ) -> torch.Tensor:
        def rows_of(i: int, wanted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self._selected_rows(i, wanted, rows)

        return attend_selected(attention, q, selection, self.queries, self.starts, rows_of)

    def _selected_rows(
        self, i: int, wanted: torch.Tensor, rows: LayerRows
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence i's rows at sorted positions `wanted`: earlier tokens from its tiers, then
        the ones this forward computed (rows of `rows`, the step's new rows)."""
        store, span, layer = self.tiered[i], self.queries[i], self._layer
        first_new = self.lengths[i] - (span.stop - span.start)
        old = wanted[wanted < first_new]
        new_at = wanted[wanted >= first_new] - first_new + span.start
        if span.stop - span.start == 1:
            latent, rope = store.fetch_hot(layer, old)
            store.counters.resident += int(new_at.numel())
            store.place_new(layer, first_new, rows.latent[span.start], rows.rope_keys[span.start])
        else:
            latent, rope = store.fetch_temporary(layer, old)
        return (
            torch.cat((latent, rows.latent.index_select(0, new_at))),
            torch.cat((rope, rows.rope_keys.index_select(0, new_at))),
        )
