"""HiSparseHooks: the LayerHooks of one engine forward whose latent rows live in a host tier
(kv/hisparse_cache.py): the indexer scores device-resident keys, and attention reads only the
selected rows, resolved resident (this step's) -> the request's hot buffer -> the host tier.

Owns that resolution per forward; never allocates blocks, hot buffers or decides what runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loom_runtime.kv.hisparse_cache import HiSparseKVCache, HotRows
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.sparse_mla.cache import LayerRows
from loom_runtime.models.sparse_mla.hooks import LocalCompute
from loom_runtime.models.sparse_mla.indexer import Indexer, Selection
from loom_runtime.models.sparse_mla.mla import MlaAttention, Queries
from loom_runtime.models.sparse_mla.paged_hooks import ContextPacking, select_per_sequence
from loom_runtime.models.sparse_mla.rotary import PairTables
from loom_runtime.models.sparse_mla.selected_rows import attend_selected


class HiSparseHooks(LocalCompute):
    """`hot[i]` is sequence i's hot buffers. A sequence with one query this step (a decode)
    reads its selected earlier rows through them; a wider one (a prefill chunk, whose queries
    together select far more than top-k rows) copies its selected rows in for this step only.

    `rows` returns only the step's own new rows (the context's are in the host tier) with the
    packed device index keys; `attend` packs each sequence's distinct selected rows end to end
    and remaps the selection onto them, so one batched attention reads exactly the rows, in the
    order, that the all-on-device PagedHooks would."""

    def __init__(
        self, kv: HiSparseKVCache, batch: ForwardBatch, hot: Sequence[HotRows | None]
    ) -> None:
        if len(hot) != batch.num_seqs:
            raise ValueError(f"HiSparseHooks: {len(hot)} hot buffers for {batch.num_seqs} seqs")
        self.kv = kv
        self.batch = batch
        self.hot = list(hot)
        self.packing = ContextPacking.of(batch, kv.spec.block_size, kv.device)
        self._tables = [torch.tensor(t, dtype=torch.long) for t in batch.block_tables]
        self._layer = -1

    def rows(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        self.kv.write(layer, self.batch.slot_mapping, latent, rope_keys, index_keys)
        self._layer = layer
        keys = self.kv.index_keys(layer, self.packing.blocks)
        new_latent, new_rope = self.kv.as_stored(latent, rope_keys)
        return LayerRows(
            latent=new_latent,
            rope_keys=new_rope,
            index_keys=None if keys is None else keys.index_select(0, self.packing.keep),
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
        b = self.batch
        return select_per_sequence(
            indexer, b.query_start, self.packing.starts, b.context_lens, h, q_resid, rope,
            rows.indexer_keys(), positions,
        )  # fmt: skip

    def attend(
        self, attention: MlaAttention, q: Queries, rows: LayerRows, selection: Selection
    ) -> torch.Tensor:
        qs = self.batch.query_start
        spans = [slice(qs[i], qs[i + 1]) for i in range(self.batch.num_seqs)]

        def rows_of(i: int, wanted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self._selected_rows(i, wanted, rows)

        return attend_selected(attention, q, selection, spans, self.packing.starts, rows_of)

    def _selected_rows(
        self, i: int, wanted: torch.Tensor, rows: LayerRows
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence i's rows at sorted positions `wanted`: earlier tokens from the hot buffer
        or the host, then the ones computed this step (resident)."""
        qs, bs, layer = self.batch.query_start, self.kv.spec.block_size, self._layer
        first_new = self.batch.context_lens[i] - (qs[i + 1] - qs[i])
        old = wanted[wanted < first_new]
        new_at = wanted[wanted >= first_new] - first_new + qs[i]
        cpu_old = old.cpu()
        slots = self._tables[i][cpu_old // bs] * bs + cpu_old % bs
        hot = self.hot[i]
        if hot is not None and qs[i + 1] - qs[i] == 1:
            latent, rope = self.kv.fetch_selected(hot, layer, cpu_old.tolist(), slots)
            self.kv.counters.resident += int(new_at.numel())
            self.kv.place_new(hot, layer, first_new, rows.latent[qs[i]], rows.rope_keys[qs[i]])
        else:
            latent, rope = self.kv.fetch_temporary(layer, slots)
        return (
            torch.cat((latent, rows.latent.index_select(0, new_at))),
            torch.cat((rope, rows.rope_keys.index_select(0, new_at))),
        )
