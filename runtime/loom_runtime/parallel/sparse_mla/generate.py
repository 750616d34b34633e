"""A greedy generation run on the ranks of one sparse-mla worker: join the layout's groups,
load the checkpoint, prefill (PCP), decode N steps (DCP, EP), report tokens, logits, timings and
the KV bytes this rank holds. The program parity tests and the context-parallel bench run.

Owns that one request's run on one rank; never serves (the engine will drive ParallelSequence).
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
from loom_runtime.parallel.sparse_mla.sequence import ParallelSequence


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


def _greedy(replica: Comm, logits: torch.Tensor) -> int:
    """argmax on the replica's first rank (the scheduler's), the same token on all of them."""
    token = logits.argmax().reshape(1)
    return int(broadcast(replica, token, 0).item())
