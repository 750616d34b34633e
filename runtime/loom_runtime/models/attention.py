"""Grouped-query attention over the paged KV cache for a mixed batch of prefill chunks and decodes.

Reads block tables from the ForwardBatch and KV from the cache; never allocates or frees blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from loom_runtime import kernels
from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.invariant_attention import (
    DecodeTiles,
    invariant_attention,
    invariant_decode,
)


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
    """All single-token sequences of the batch and their packed blocks.

    The blocks of every sequence stand one after another (no padding). On a CPU, Loom's kernel
    reads the pool in place through them (`starts`, `context_lens`); the torch path gathers
    keys and values once per layer, exactly the KV the step attends to, each sequence's share
    one contiguous matrix (`spans`).
    """

    rows: torch.Tensor | None  # [B] rows of T; None when they are exactly 0..T-1
    blocks: torch.Tensor  # [N] int64: sequence 0's blocks, then sequence 1's, ...
    spans: tuple[tuple[int, int], ...]  # per sequence: (first key row in the packed gather, length)
    starts: torch.Tensor  # [B + 1] int64: where each sequence's blocks begin in `blocks`
    context_lens: torch.Tensor  # [B] int64

    @cached_property
    def invariant_tiles(self) -> DecodeTiles:
        """Where batch-invariant attention reads each sequence's keys (every layer alike)."""
        return DecodeTiles.of(self.spans, self.blocks.device)


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
    spans: list[tuple[int, int]] = []
    starts = [0]
    for i in seqs:
        ctx = batch.context_lens[i]
        spans.append((len(blocks) * block_size, ctx))
        blocks.extend(batch.block_tables[i][: -(-ctx // block_size)])
        starts.append(len(blocks))
    all_rows = rows == list(range(batch.num_tokens))
    row_index = None if all_rows else torch.as_tensor(rows, dtype=torch.long, device=device)
    return DecodeGroup(
        rows=row_index,
        blocks=torch.as_tensor(blocks, dtype=torch.long, device=device),
        spans=tuple(spans),
        starts=torch.as_tensor(starts, dtype=torch.long, device=device),
        context_lens=torch.as_tensor([n for _, n in spans], dtype=torch.long, device=device),
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
    invariant: bool = False,
) -> torch.Tensor:
    """Write k, v ([T, kv_heads, D]) to their slots, then attend q ([T, heads, D]) -> [T, heads, D].

    Each token sees its sequence's cached prefix plus the causal part of its own chunk.
    `invariant`: every sequence through models/invariant_attention.py, so a token's output is
    the same bits whatever shares its step, however its prompt was chunked or cached.
    """
    kv.write(layer, slot_mapping, k, v)
    if invariant:
        return _invariant(q, kv, layer, plan, scale)
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


def _invariant(
    q: torch.Tensor, kv: PagedKVCache, layer: int, plan: AttentionPlan, scale: float
) -> torch.Tensor:
    """Each sequence's queries over its keys as the cache holds them (a fresh chunk's too)."""
    out = torch.empty_like(q)
    for seq in plan.prefills:
        keys, values = kv.gather(layer, seq.blocks)
        n = seq.end - seq.start
        last = torch.arange(seq.context_len - n, seq.context_len, device=q.device)
        out[seq.start : seq.end] = invariant_attention(
            q[seq.start : seq.end], keys, values, last, scale
        )
    group = plan.decode
    if group is None:
        return out
    keys, values = kv.gather(layer, group.blocks)
    q_dec = q if group.rows is None else q.index_select(0, group.rows)
    o_dec = invariant_decode(q_dec, keys, values, group.invariant_tiles, scale)
    if group.rows is None:
        return o_dec
    out[group.rows] = o_dec
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
    if seq.mask is None:  # a fresh prompt: its keys are this chunk's, as the cache stores them
        k_s, v_s = kv.as_stored(k[seq.start : seq.end]), kv.as_stored(v[seq.start : seq.end])
    else:
        keys, values = kv.gather(layer, seq.blocks)  # [n * S, KVH, D] each
        k_s, v_s = keys[: seq.context_len], values[: seq.context_len]
    k_s = k_s.to(q.dtype).transpose(0, 1)[None]  # [1, KVH, L, D]
    v_s = v_s.to(q.dtype).transpose(0, 1)[None]
    o = F.scaled_dot_product_attention(
        q_s, k_s, v_s, attn_mask=seq.mask, is_causal=seq.mask is None, scale=scale, enable_gqa=True
    )
    return o[0].transpose(0, 1)


def _decode(
    q: torch.Tensor, kv: PagedKVCache, layer: int, group: DecodeGroup, scale: float
) -> torch.Tensor:
    """One query per sequence ([B, heads, D]) against its own keys -> [B, heads, D].

    On a CPU, Loom's kernel attends every sequence in one call, reading the blocks where they
    lie in the pool (bench/decode_step.py times it against the torch path); an fp8 pool's
    blocks are first dequantised into a pool of their own, so both stores share one kernel.
    Elsewhere, and in float64 (the parity precision: the kernel accumulates in float32, which
    would cap a float64 decode near 1e-8), the torch path."""
    exact = q.dtype == torch.float64
    if q.device.type == "cpu" and q.dtype == kv.spec.dtype and not exact and kernels.available():
        pool, at, blocks = _kernel_pool(kv, layer, group)
        return kernels.paged_decode(
            q.contiguous(), pool, at, blocks, group.starts, group.context_lens, scale
        )
    return decode_by_sequence(q, kv, layer, group, scale)


def _kernel_pool(
    kv: PagedKVCache, layer: int, group: DecodeGroup
) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(pool, its layer, the blocks in it) for the kernel: the cache itself, or for fp8 the
    group's blocks of this layer dequantised into a one-layer pool [N, 1, 2, block_size, ...]."""
    if kv.spec.fp8 is None:
        return kv.data, layer, group.blocks
    pool = kv.gather_blocks(layer, group.blocks).unsqueeze(1)
    return pool, 0, torch.arange(len(group.blocks), device=group.blocks.device)


def decode_by_sequence(
    q: torch.Tensor, kv: PagedKVCache, layer: int, group: DecodeGroup, scale: float
) -> torch.Tensor:
    """The torch path: the packed gather holds every sequence's keys as one contiguous
    [length, kv_heads, D] matrix, so each sequence is one fused attention call with grouped-query
    heads and no mask or padding.

    On a CPU this beats one batched matmul over all blocks: torch's batched GEMM pays per
    matrix, and a block's matrix (heads x block_size) is too small to earn it
    (bench/decode_step.py).
    """
    keys, values = kv.gather(layer, group.blocks)
    keys, values = keys.to(q.dtype), values.to(q.dtype)
    outs = [
        F.scaled_dot_product_attention(
            q[j, :, None],  # [heads, 1, D]
            keys[at : at + length].transpose(0, 1),  # [kv_heads, length, D]
            values[at : at + length].transpose(0, 1),
            scale=scale,
            enable_gqa=True,
        )
        for j, (at, length) in enumerate(group.spans)
    ]
    return torch.cat(outs, dim=1).transpose(0, 1)  # [B, heads, D]
