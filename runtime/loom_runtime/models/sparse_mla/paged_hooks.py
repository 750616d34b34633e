"""PagedHooks: the LayerHooks of one engine forward over a paged latent KV cache — many
sequences' prefill chunks and decode tokens, each attending over its own blocks only.

Owns the packing of each sequence's context rows and the per-sequence top-k; never allocates
blocks or decides what runs (the engine's scheduler and runner do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.sparse_mla.cache import LayerRows
from loom_runtime.models.sparse_mla.hooks import LocalCompute
from loom_runtime.models.sparse_mla.indexer import Indexer, Selection
from loom_runtime.models.sparse_mla.rotary import PairTables


class PagedHooks(LocalCompute):
    """The rows of a layer are every sequence's context packed end to end (sequence i's tokens
    0..context_lens[i]-1 at `starts[i]`), so a selection's indices point into the packed rows
    and one batched attention call serves all T queries. Dense parts (FFN) run over all T."""

    def __init__(self, kv: LatentKVCache, batch: ForwardBatch, width: int | None = None) -> None:
        self.kv = kv
        self.batch = batch
        self.width = width  # every sequence's selection padded to it (None: to the widest)
        self.packing = ContextPacking.of(batch, kv.spec.block_size, kv.data.device)

    def rows(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        self.kv.write(layer, self.batch.slot_mapping, latent, rope_keys, index_keys)
        lat, rope, keys = self.kv.gather(layer, self.packing.blocks)
        keep = self.packing.keep
        return LayerRows(
            latent=lat.index_select(0, keep),
            rope_keys=rope.index_select(0, keep),
            index_keys=None if keys is None else keys.index_select(0, keep),
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
            rows.indexer_keys(), positions, self.width,
        )  # fmt: skip


@dataclass(frozen=True)
class ContextPacking:
    """Where each sequence's context rows sit once its blocks are gathered and packed end to
    end: `blocks` to gather (every table's, in order), `keep` the gathered rows that are real
    tokens (a last block's tail is not), `starts[i]` sequence i's first packed row."""

    blocks: torch.Tensor  # int64 [sum of table lengths]
    keep: torch.Tensor  # int64 [sum of context_lens]
    starts: list[int]

    @classmethod
    def of(cls, batch: ForwardBatch, block_size: int, device: torch.device) -> ContextPacking:
        blocks = [b for table in batch.block_tables for b in table]
        keep: list[int] = []
        starts: list[int] = []
        base = 0
        for table, length in zip(batch.block_tables, batch.context_lens, strict=True):
            starts.append(len(keep))
            keep.extend(range(base, base + length))
            base += len(table) * block_size
        return cls(
            blocks=torch.tensor(blocks, dtype=torch.long, device=device),
            keep=torch.tensor(keep, dtype=torch.long, device=device),
            starts=starts,
        )


def select_per_sequence(
    indexer: Indexer,
    query_start: Sequence[int],
    starts: Sequence[int],
    context_lens: Sequence[int],
    h: torch.Tensor,
    q_resid: torch.Tensor,
    rope: PairTables,
    keys: torch.Tensor,
    positions: torch.Tensor,
    width: int | None = None,
) -> Selection:
    """Each sequence's queries (rows query_start[i]..query_start[i+1]-1) pick their top-k among
    that sequence's keys only (packed keys `keys`, sequence i's context_lens[i] at `starts[i]`);
    the selections are padded (valid False) to `width` (None: the widest) and offset into the
    packed rows."""
    qs = query_start
    parts: list[Selection] = []
    for i, (start, length) in enumerate(zip(starts, context_lens, strict=True)):
        q = slice(qs[i], qs[i + 1])
        sel = indexer.select(
            h[q],
            q_resid[q],
            PairTables(cos=rope.cos[q], sin=rope.sin[q]),
            keys[start : start + length],
            positions[q],
        )
        parts.append(Selection(indices=sel.indices + start, valid=sel.valid))
    width = max(p.indices.shape[1] for p in parts) if width is None else width
    return Selection(
        indices=torch.cat([F.pad(p.indices, (0, width - p.indices.shape[1])) for p in parts]),
        valid=torch.cat([F.pad(p.valid, (0, width - p.valid.shape[1])) for p in parts]),
    )
