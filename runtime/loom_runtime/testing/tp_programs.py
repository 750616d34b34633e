"""A rank program for the tests of loom_runtime.parallel.llama: every rank builds the same
seeded random llama-family model, runs a prefill chunk and a decode step of two sequences over
a paged cache once whole (the reference) and once as its TP shard with its own kv heads' pool,
and returns both logits.

Owns nothing a production worker runs; never used by the runtime itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.config import ModelConfig
from loom_runtime.models.llama import LlamaForCausalLM
from loom_runtime.parallel.collectives import Comm
from loom_runtime.parallel.llama.tp import shard_llama
from loom_runtime.parallel.ranks import RankContext

BLOCK = 4


@dataclass(frozen=True)
class TpForward:
    reference: torch.Tensor  # the whole model's logits: prefill rows, then decode rows
    sharded: torch.Tensor  # this rank's TP forward of the same batches


def tp_forward(ctx: RankContext, config: ModelConfig, seed: int) -> TpForward:
    group = dist.new_group(list(range(ctx.world)), timeout=timedelta(seconds=60))
    comm = Comm(ranks=tuple(range(ctx.world)), index=ctx.rank, group=group)
    whole = LlamaForCausalLM(config, torch.float64)
    gen = torch.Generator().manual_seed(seed)
    for tensor in {id(t): t for t in whole.targets().values()}.values():
        tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float64) * 0.2)
    shard = shard_llama(whole, comm)
    out = []
    for model in (whole, shard):
        kv = model.config.kv_spec(BLOCK, 16, torch.float64).allocate("cpu")
        logits = [model.forward(batch, kv) for batch in _batches(config.vocab_size)]
        out.append(torch.cat(logits))
    return TpForward(reference=out[0], sharded=out[1])


def _batches(vocab: int) -> list[ForwardBatch]:
    """Two sequences' prompt chunks (11 and 6 tokens), then one decode token each."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(vocab, (17,), generator=gen)
    prefill = ForwardBatch(
        input_ids=ids,
        positions=torch.cat((torch.arange(11), torch.arange(6))),
        query_start=[0, 11, 17],
        context_lens=[11, 6],
        block_tables=[[5, 2, 9], [0, 7]],
        slot_mapping=torch.tensor(_slots([5, 2, 9], 0, 11) + _slots([0, 7], 0, 6)),
        logits_indices=torch.arange(17),
    )
    decode = ForwardBatch(
        input_ids=torch.randint(vocab, (2,), generator=gen),
        positions=torch.tensor([11, 6]),
        query_start=[0, 1, 2],
        context_lens=[12, 7],
        block_tables=[[5, 2, 9], [0, 7]],
        slot_mapping=torch.tensor(_slots([5, 2, 9], 11, 12) + _slots([0, 7], 6, 7)),
        logits_indices=torch.arange(2),
    )
    return [prefill, decode]


def _slots(table: list[int], start: int, end: int) -> list[int]:
    return [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, end)]
