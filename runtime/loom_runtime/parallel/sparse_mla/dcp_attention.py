"""DCP decode attention over a token-sharded cache: the indexer's GLOBAL top-k from each rank's
local best (a distributed top-k), and the log-sum-exp merge of the ranks' partial outputs,
either `ag_rs` (all-gather LSEs, rescale, reduce-scatter by head) or `a2a` (all-to-all the
partials by head, merge locally); both end with every rank holding every head's output.

Owns those exchanges; never stores rows (store.py) or computes scores itself (the indexer).
"""

from __future__ import annotations

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


def global_top_k(
    comm: Comm,
    shard: ShardMap,
    indexer: Indexer,
    h: torch.Tensor,
    q_resid: torch.Tensor,
    rope: PairTables,
    keys: torch.Tensor,
    positions: torch.Tensor,
    key_positions: torch.Tensor,
    length: int,
) -> Selection:
    """The top-k one rank would pick over all `length` tokens, as indices into this rank's
    shard (entries owned elsewhere are invalid here).

    The global best k are among the union of every rank's local best k, so each rank sends
    only those (score, position) pairs; ties go to the earlier position, as on one rank.
    """
    k = min(indexer.config.index_topk, length)
    values, indices = indexer.best(h, q_resid, rope, keys, positions, key_positions, k)
    n, t = values.shape[1], values.shape[0]
    best = torch.full((t, k, 2), float("-inf"), dtype=torch.float64, device=values.device)
    best[..., 1] = float(length)  # padding sorts after every real position
    best[:, :n, 0] = values.double()
    best[:, :n, 1] = key_positions[indices].double()
    pool = all_gather_same(comm, best).permute(1, 0, 2, 3).reshape(t, comm.size * k, 2)
    pool = _take(pool, pool[..., 1].sort(dim=-1, stable=True).indices)
    pool = _take(pool, pool[..., 0].sort(dim=-1, descending=True, stable=True).indices[:, :k])
    chosen = pool[..., 1].long()
    step = shard.world * shard.interleave
    mine = (pool[..., 0] > float("-inf")) & (
        (chosen // shard.interleave) % shard.world == shard.rank
    )
    slots = (chosen // step) * shard.interleave + chosen % shard.interleave
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
