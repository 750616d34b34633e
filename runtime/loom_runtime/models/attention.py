"""Grouped-query attention over the paged KV cache for a mixed batch of prefill chunks and decodes.

Reads block tables from the ForwardBatch and KV from the cache; never allocates or frees blocks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.models.batch import ForwardBatch


@dataclass(frozen=True)
class PrefillSeq:
    """One sequence with more than one new token: rows start:end of T, context_len keys."""

    start: int
    end: int
    context_len: int
    blocks: torch.Tensor  # [ceil(context_len / block_size)] int64
    mask: torch.Tensor | None  # [n, context_len] bool; None when the chunk is the whole context


@dataclass(frozen=True)
class DecodeGroup:
    """All single-token sequences of the batch, attended together over their packed blocks.

    The blocks of every sequence stand one after another (no padding): one gather per layer
    reads exactly the KV the step attends to.
    """

    rows: torch.Tensor | None  # [B] rows of T; None when they are exactly 0..T-1
    num_seqs: int  # B
    blocks: torch.Tensor  # [N] int64: sequence 0's blocks, then sequence 1's, ...
    seq_of_block: torch.Tensor  # [N] int64: which of the B sequences each block belongs to
    beyond: torch.Tensor | None  # [N, 1, block_size, 1] bool: slots past a sequence's end


@dataclass(frozen=True)
class AttentionPlan:
    """Per-forward attention layout, built once and shared by every layer."""

    prefills: tuple[PrefillSeq, ...]
    decode: DecodeGroup | None


def plan_attention(batch: ForwardBatch, block_size: int, device: torch.device) -> AttentionPlan:
    """Split the batch into prefill chunks and one decode group; checks the block tables."""
    prefills: list[PrefillSeq] = []
    decode_rows: list[int] = []
    decode_seqs: list[int] = []
    for i, ctx in enumerate(batch.context_lens):
        start, end = batch.query_start[i], batch.query_start[i + 1]
        n = end - start
        table = batch.block_tables[i]
        if n < 1 or ctx < n or len(table) * block_size < ctx:
            raise ValueError(
                f"ForwardBatch sequence {i}: {n} new tokens, context_len {ctx}, "
                f"{len(table)} blocks of {block_size}: the blocks must hold the context"
            )
        if n == 1:
            decode_rows.append(start)
            decode_seqs.append(i)
            continue
        blocks = torch.as_tensor(table[: -(-ctx // block_size)], dtype=torch.long, device=device)
        mask = None
        if ctx != n:
            keys = torch.arange(ctx, device=device)
            last_key = ctx - n + torch.arange(n, device=device)
            mask = keys[None, :] <= last_key[:, None]
        prefills.append(PrefillSeq(start, end, ctx, blocks, mask))
    decode = _plan_decode(batch, decode_rows, decode_seqs, block_size, device)
    return AttentionPlan(prefills=tuple(prefills), decode=decode)


def _plan_decode(
    batch: ForwardBatch,
    rows: list[int],
    seqs: list[int],
    block_size: int,
    device: torch.device,
) -> DecodeGroup | None:
    if not rows:
        return None
    blocks: list[int] = []
    owner: list[int] = []
    partial: list[tuple[int, int]] = []  # (packed index of a last block, valid slots in it)
    for j, i in enumerate(seqs):
        n = -(-batch.context_lens[i] // block_size)
        blocks.extend(batch.block_tables[i][:n])
        owner.extend([j] * n)
        if batch.context_lens[i] % block_size:
            partial.append((len(blocks) - 1, batch.context_lens[i] % block_size))
    beyond = None
    if partial:
        beyond = torch.zeros(len(blocks), 1, block_size, 1, dtype=torch.bool)
        for at, valid in partial:
            beyond[at, :, valid:] = True
        beyond = beyond.to(device)
    all_rows = rows == list(range(batch.num_tokens))
    row_index = None if all_rows else torch.as_tensor(rows, dtype=torch.long, device=device)
    return DecodeGroup(
        rows=row_index,
        num_seqs=len(seqs),
        blocks=torch.as_tensor(blocks, dtype=torch.long, device=device),
        seq_of_block=torch.as_tensor(owner, dtype=torch.long, device=device),
        beyond=beyond,
    )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: PagedKVCache,
    layer: int,
    plan: AttentionPlan,
    slot_mapping: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Write k, v ([T, kv_heads, D]) to their slots, then attend q ([T, heads, D]) -> [T, heads, D].

    Each token sees its sequence's cached prefix plus the causal part of its own chunk.
    """
    kv.write(layer, slot_mapping, k, v)
    out = torch.empty_like(q)
    for seq in plan.prefills:
        out[seq.start : seq.end] = _prefill(q, k, v, kv, layer, seq, scale)
    if plan.decode is not None:
        rows = plan.decode.rows
        q_dec = q if rows is None else q.index_select(0, rows)
        o_dec = _decode(q_dec, kv, layer, plan.decode, scale)
        if rows is None:
            out = o_dec
        else:
            out[rows] = o_dec
    return out


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: PagedKVCache,
    layer: int,
    seq: PrefillSeq,
    scale: float,
) -> torch.Tensor:
    q_s = q[seq.start : seq.end].transpose(0, 1)[None]  # [1, H, n, D]
    if seq.mask is None:  # a fresh prompt: its keys are exactly this chunk's
        k_s, v_s = k[seq.start : seq.end], v[seq.start : seq.end]
    else:
        blocks = kv.layer_blocks(layer).index_select(0, seq.blocks)  # [n, 2, S, KVH, D]
        k_s = blocks[:, 0].flatten(0, 1)[: seq.context_len]
        v_s = blocks[:, 1].flatten(0, 1)[: seq.context_len]
    k_s = k_s.to(q.dtype).transpose(0, 1)[None]  # [1, KVH, L, D]
    v_s = v_s.to(q.dtype).transpose(0, 1)[None]
    o = F.scaled_dot_product_attention(
        q_s, k_s, v_s, attn_mask=seq.mask, is_causal=seq.mask is None, scale=scale, enable_gqa=True
    )
    return o[0].transpose(0, 1)


def _decode(
    q: torch.Tensor, kv: PagedKVCache, layer: int, group: DecodeGroup, scale: float
) -> torch.Tensor:
    """One query per sequence against its packed blocks: scores block by block, then one
    softmax per sequence across its blocks (max and sum reduced per sequence).

    Per block, every query head meets every (token, KV head) key as one contiguous matmul;
    the pairs of a query head with another group's KV head are masked out, so each query
    head attends to its own KV head only (grouped-query attention) without a copy of K or V.
    """
    b, heads, dim = q.shape
    kv_heads = kv.spec.num_kv_heads
    size = kv.spec.block_size
    owner = group.seq_of_block
    n = owner.shape[0]
    kv_blocks = kv.layer_blocks(layer).index_select(0, group.blocks).to(q.dtype)  # [N,2,S,KVH,D]
    k = kv_blocks[:, 0].reshape(n, size * kv_heads, dim)  # rows: token-major, then KV head
    v = kv_blocks[:, 1].reshape(n, size * kv_heads, dim)
    q_blocks = (q * scale).index_select(0, owner)  # [N, H, D]
    scores = torch.bmm(q_blocks, k.transpose(1, 2))  # [N, H, S * KVH]
    grid = scores.view(n, heads, size, kv_heads)
    grid.masked_fill_(_other_groups(heads, kv_heads, q.device), float("-inf"))
    if group.beyond is not None:
        grid.masked_fill_(group.beyond, float("-inf"))
    per_block_max = scores.amax(-1)  # [N, H]
    seq_max = torch.full((b, heads), float("-inf"), dtype=q.dtype, device=q.device)
    seq_max.scatter_reduce_(0, owner[:, None].expand(n, heads), per_block_max, "amax")
    weights = torch.exp_(scores - seq_max.index_select(0, owner).unsqueeze(-1))
    total = torch.zeros(b, heads, dtype=q.dtype, device=q.device)
    total.index_add_(0, owner, weights.sum(-1))
    out = torch.zeros(b, heads, dim, dtype=q.dtype, device=q.device)
    out.index_add_(0, owner, torch.bmm(weights, v))
    return out / total.unsqueeze(-1)


@functools.lru_cache(maxsize=16)
def _other_groups(heads: int, kv_heads: int, device: torch.device) -> torch.Tensor:
    """[H, 1, KVH] bool: True where query head h does not read KV head j (j != h // group)."""
    group = torch.arange(heads, device=device) // (heads // kv_heads)
    return (group[:, None] != torch.arange(kv_heads, device=device)[None, :])[:, None, :]
