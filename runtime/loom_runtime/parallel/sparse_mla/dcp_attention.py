"""DCP decode attention over a token-sharded cache: the indexer's GLOBAL top-k from each rank's
local best (a distributed top-k), and the log-sum-exp merge of the ranks' partial outputs,
either `ag_rs` (all-gather LSEs, rescale, reduce-scatter by head) or `a2a` (all-to-all the
partials by head, merge locally); both end with every rank holding every head's output.

Owns those exchanges; never stores rows (store.py) or computes scores itself (the indexer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loom_runtime.models.sparse_mla.indexer import Indexer, Selection
from loom_runtime.models.sparse_mla.mla import PartialAttention
from loom_runtime.models.sparse_mla.rotary import PairTables
from loom_runtime.parallel.collectives import (
    Comm,
    all_gather_same,
    all_to_all_rows,
    reduce_scatter_sum,
)
from loom_runtime.parallel.dcp_shard import ShardMap
from loom_runtime.parallel.lse_merge import merge, merged_lse, rescale


@dataclass(frozen=True)
class ShardSegment:
    """One sequence of a DCP forward: its queries (rows `queries` of the forward), its rows on
    this rank (from `start` in the packed rows, at global `key_positions`), and `length`, the
    tokens of the whole sequence its queries see."""

    queries: slice
    start: int
    key_positions: torch.Tensor
    length: int


def global_top_k(
    comm: Comm,
    shard: ShardMap,
    indexer: Indexer,
    h: torch.Tensor,
    q_resid: torch.Tensor,
    rope: PairTables,
    keys: torch.Tensor,
    positions: torch.Tensor,
    segments: Sequence[ShardSegment],
) -> Selection:
    """The top-k one rank would pick for each query over all tokens of its sequence, as indices
    into this rank's packed rows (entries owned elsewhere are invalid here); one exchange for
    every sequence of the forward.

    The global best k are among the union of every rank's local best k, so each rank sends
    only those (score, position) pairs; ties go to the earlier position, as on one rank. A
    sequence whose k is below the forward's widest has fewer tokens than top-k, so its
    columns past them can only be padding (−inf: invalid).
    """
    t, device = h.shape[0], h.device
    ks = [min(indexer.config.index_topk, s.length) for s in segments]
    width = max(ks)
    best = torch.full((t, width, 2), float("-inf"), dtype=torch.float64, device=device)
    best[..., 1] = float(max(s.length for s in segments))  # padding sorts after real positions
    offset = torch.zeros(t, 1, dtype=torch.long, device=device)
    for s, k in zip(segments, ks, strict=True):
        q = s.queries
        local = keys[s.start : s.start + s.key_positions.shape[0]]
        tables = PairTables(cos=rope.cos[q], sin=rope.sin[q])
        values, indices = indexer.best(
            h[q], q_resid[q], tables, local, positions[q], s.key_positions, k
        )
        n = values.shape[1]
        best[q, :n, 0] = values.double()
        best[q, :n, 1] = s.key_positions[indices].double()
        offset[q] = s.start
    pool = all_gather_same(comm, best).permute(1, 0, 2, 3).reshape(t, comm.size * width, 2)
    pool = _take(pool, pool[..., 1].sort(dim=-1, stable=True).indices)
    pool = _take(pool, pool[..., 0].sort(dim=-1, descending=True, stable=True).indices[:, :width])
    chosen = pool[..., 1].long()
    step = shard.world * shard.interleave
    mine = (pool[..., 0] > float("-inf")) & (
        (chosen // shard.interleave) % shard.world == shard.rank
    )
    slots = (chosen // step) * shard.interleave + chosen % shard.interleave + offset
    return Selection(indices=torch.where(mine, slots, torch.zeros_like(slots)), valid=mine)


def merge_partials(comm: Comm, part: PartialAttention, backend: str) -> torch.Tensor:
    """Every head's merged latent output [T, heads, rank] on every rank of the group."""
    if comm.size == 1:
        return part.latent
    if backend == "ag_rs":
        mine = _merge_ag_rs(comm, part)
    elif backend == "a2a":
        mine = _merge_a2a(comm, part)
    else:
        raise ValueError(f"dcp backend {backend!r} is not 'ag_rs' or 'a2a'")
    heads = all_gather_same(comm, mine)  # [W, heads/W, T, rank]
    return heads.flatten(0, 1).transpose(0, 1)


def _merge_ag_rs(comm: Comm, part: PartialAttention) -> torch.Tensor:
    """All-gather the LSEs, rescale locally, reduce-scatter by head: [heads/W, T, rank]."""
    total = merged_lse(all_gather_same(comm, part.lse))
    scaled = rescale(part.latent, part.lse, total)  # [T, heads, rank]
    return reduce_scatter_sum(comm, scaled.transpose(0, 1).contiguous())


def _merge_a2a(comm: Comm, part: PartialAttention) -> torch.Tensor:
    """All-to-all each head group's (output, LSE) to its rank, merge there: [heads/W, T, rank]."""
    heads = part.latent.shape[1]
    width = part.latent.shape[2]
    packed = torch.cat((part.latent, part.lse[..., None].to(part.latent.dtype)), dim=-1)
    counts = [heads // comm.size] * comm.size
    got, _ = all_to_all_rows(comm, packed.transpose(0, 1).contiguous(), counts, counts)
    got = got.view(comm.size, heads // comm.size, *got.shape[1:])  # [W, heads/W, T, rank+1]
    out, _ = merge(got[..., :width], got[..., width])
    return out


def _take(pool: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return pool.gather(1, index[..., None].expand(-1, -1, pool.shape[-1]))
