"""Greedy generation runs on the ranks of one sparse-mla worker: join the layout's groups,
load the checkpoint, prefill (PCP), decode N steps (DCP, EP), report tokens, logits, timings and
the KV bytes this rank holds: `generate` (one request per DP replica) and `generate_batch`
(several requests decoded together). The programs parity tests and the benches run.

Owns those runs on one rank; never serves (the engine drives ParallelSequence).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from loom_runtime.models.sparse_mla.loader import load_sparse_mla
from loom_runtime.parallel.collectives import Comm, broadcast
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.parallel.ranks import RankContext
from loom_runtime.parallel.sparse_mla.ep_moe import shard_experts
from loom_runtime.parallel.sparse_mla.plan import DcpBackend, join_groups
from loom_runtime.parallel.sparse_mla.sequence import ParallelSequence, decode_batch


@dataclass(frozen=True)
class GenerateRequest:
    checkpoint: str
    prompts: tuple[tuple[int, ...], ...]  # one per DP replica
    decode_steps: int
    layout: ParallelLayout
    dcp_backend: DcpBackend = "ag_rs"
    dtype: str = "float64"
    all_logits: bool = True  # return every prompt token's logits, not only the last
    block_size: int = 16
    pcp_split: bool = True  # False: every rank computes the whole prompt (DCP-only prefill)
    prefill_chunk: int = 0  # > 0: prefill in chunks of this many tokens (chunked prefill)


@dataclass(frozen=True)
class GenerateTrace:
    """What one rank saw. tokens[0] comes from the prompt's last logits, tokens[i + 1] from
    step_logits[i], the logits of decode step i (fed tokens[i])."""

    rank: int
    tokens: tuple[int, ...]
    prompt_logits: torch.Tensor  # [T or 1, vocab]
    step_logits: torch.Tensor  # [decode_steps, vocab]
    kv_tokens: int  # tokens whose rows this rank holds at the end
    kv_bytes_per_token: int
    kv_block_bytes: int  # in whole blocks of block_size
    expert_bytes: int  # routed-expert weights this rank holds
    prefill_s: float
    decode_s: float


def generate(ctx: RankContext, request: GenerateRequest) -> GenerateTrace:
    """Run on every rank (ranks.run_ranks); all ranks of a replica return the same tokens."""
    plan = join_groups(
        request.layout, ctx.rank, ctx.device, ctx.collective_timeout_s, request.dcp_backend
    )
    model = load_sparse_mla(request.checkpoint, getattr(torch, request.dtype), ctx.device).model
    experts = shard_experts(model, plan.ep)
    prompt = request.prompts[plan.coords.dp]
    seq = ParallelSequence(
        model, plan, len(prompt) + request.decode_steps, experts, request.block_size
    )
    start = time.perf_counter()
    ids = torch.tensor(prompt, dtype=torch.long)
    chunk = request.prefill_chunk or len(prompt)
    parts = [
        seq.prefill(ids[at : at + chunk], request.all_logits, request.pcp_split)
        for at in range(0, len(prompt), chunk)
    ]
    prompt_logits = torch.cat(parts) if request.all_logits else parts[-1]
    prefill_s = time.perf_counter() - start
    token = _greedy(plan.pcp, prompt_logits[-1])
    tokens, steps = [token], []
    start = time.perf_counter()
    for _ in range(request.decode_steps):
        logits = seq.decode(torch.tensor([token], dtype=torch.long))[0]
        steps.append(logits)
        token = _greedy(plan.pcp, logits)
        tokens.append(token)
    decode_s = time.perf_counter() - start
    expert_bytes = sum(e.expert_bytes for e in experts.values()) or sum(
        t.numel() * t.element_size()
        for layer in model.layers
        for name, t in layer.ffn.targets().items()
        if name.startswith("experts.")
    )
    return GenerateTrace(
        rank=ctx.rank,
        tokens=tuple(tokens),
        prompt_logits=prompt_logits.cpu(),
        step_logits=torch.stack(steps).cpu() if steps else prompt_logits.new_empty(0).cpu(),
        kv_tokens=seq.store.kv_tokens,
        kv_bytes_per_token=seq.store.bytes_per_token,
        kv_block_bytes=seq.kv_block_bytes(),
        expert_bytes=expert_bytes,
        prefill_s=prefill_s,
        decode_s=decode_s,
    )


@dataclass(frozen=True)
class BatchTrace:
    """What one rank saw of a batch: per request its tokens (as GenerateTrace's) and step
    logits ([decode_steps, vocab] each)."""

    rank: int
    tokens: tuple[tuple[int, ...], ...]
    step_logits: tuple[torch.Tensor, ...]
    decode_s: float
    kv_tokens: int  # over every request


@dataclass(frozen=True)
class BatchRequest:
    """`request`'s prompts decoded together; `batched` False: one forward per request."""

    request: GenerateRequest
    batched: bool = True


def generate_batch(ctx: RankContext, batch: BatchRequest) -> BatchTrace:
    """Every prompt of the request served together by one replica (dp 1): each prefilled
    alone, then `decode_steps` steps, each one batched forward over all of them
    (decode_batch), or one forward per request (`batched` False: the baseline)."""
    request = batch.request
    if request.layout.dp != 1:
        raise ValueError(f"generate_batch serves one replica, not dp {request.layout.dp}")
    plan = join_groups(
        request.layout, ctx.rank, ctx.device, ctx.collective_timeout_s, request.dcp_backend
    )
    model = load_sparse_mla(request.checkpoint, getattr(torch, request.dtype), ctx.device).model
    experts = shard_experts(model, plan.ep)
    capacity = max(len(p) for p in request.prompts) + request.decode_steps
    seqs = [
        ParallelSequence(model, plan, capacity, experts, request.block_size)
        for _ in request.prompts
    ]
    firsts = [
        seq.prefill(torch.tensor(p, dtype=torch.long), split=request.pcp_split)[-1]
        for seq, p in zip(seqs, request.prompts, strict=True)
    ]
    tokens = [[t] for t in _greedy_rows(plan.pcp, torch.stack(firsts))]
    steps: list[list[torch.Tensor]] = [[] for _ in seqs]
    start = time.perf_counter()
    for _ in range(request.decode_steps):
        ids = torch.tensor([t[-1] for t in tokens], dtype=torch.long)
        if batch.batched:
            logits = decode_batch(seqs, ids)
        else:
            logits = torch.cat([seq.decode(ids[i : i + 1]) for i, seq in enumerate(seqs)])
        for i, token in enumerate(_greedy_rows(plan.pcp, logits)):
            steps[i].append(logits[i].cpu())
            tokens[i].append(token)
    decode_s = time.perf_counter() - start
    return BatchTrace(
        rank=ctx.rank,
        tokens=tuple(tuple(t) for t in tokens),
        step_logits=tuple(torch.stack(s) if s else torch.zeros(0) for s in steps),
        decode_s=decode_s,
        kv_tokens=sum(seq.store.kv_tokens for seq in seqs),
    )


def _greedy(replica: Comm, logits: torch.Tensor) -> int:
    """argmax on the replica's first rank (the scheduler's), the same token on all of them."""
    return _greedy_rows(replica, logits[None])[0]


def _greedy_rows(replica: Comm, logits: torch.Tensor) -> list[int]:
    """Per row of logits [n, vocab] its argmax as the replica's first rank has it."""
    tokens = logits.argmax(dim=-1)
    return [int(t) for t in broadcast(replica, tokens, 0).tolist()]
