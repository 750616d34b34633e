"""The program every rank of a tensor-parallel llama worker runs under the engine: join the TP
group, load the checkpoint and keep this rank's shard (parallel/llama/tp.py), allocate a paged
KV pool of its kv heads with the engine's block count, then run each step's ForwardBatch as it
arrives (the same batch on every rank: the engine's block tables and slots, so a block id
names the same tokens in every rank's pool and prefix caching needs nothing more) and send
back the logits from rank 0.

Owns the rank's shard and pool and the wire records of a step and a weight load; never
schedules or samples (the engine does both in its own process).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from loom_runtime.kv.cache import KVStore
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.batch import ForwardBatch
from loom_runtime.models.llama import LlamaForCausalLM
from loom_runtime.models.loader import load_model
from loom_runtime.parallel.collectives import Comm
from loom_runtime.parallel.llama.tp import shard_llama, weight_bytes
from loom_runtime.parallel.ranks import RankContext, serve_steps


@dataclass(frozen=True)
class TpServeSpec:
    """What each rank loads, and the pool it keeps (the engine's block size and count)."""

    checkpoint: str
    tp: int
    dtype: str  # torch dtype name: "float32", "float64", ...
    block_size: int
    num_blocks: int
    kv_fp8: Fp8Format | None = None
    batch_invariant: bool = False  # the engine's mode: matmuls, attention and partial sums


@dataclass(frozen=True)
class TpReady:
    """Sent once the rank has joined its group, loaded its shard and allocated its pool."""

    rank: int
    kv_bytes_per_token: int  # this rank's kv heads of one token, all layers
    weight_bytes: int  # the weights it holds: its shards and the replicated parts


@dataclass(frozen=True)
class TpStep:
    batch: ForwardBatch


@dataclass(frozen=True)
class TpReply:
    logits: torch.Tensor | None  # [N, vocab] on rank 0, None elsewhere


@dataclass(frozen=True)
class TpLoad:
    """Replace the weights with a checkpoint's (a weight sync; the engine is drained)."""

    checkpoint: str


@dataclass(frozen=True)
class TpLoaded:
    rank: int
    weight_bytes: int


class TpRank:
    """One rank's shard and pool, and how a step runs on them."""

    def __init__(self, ctx: RankContext, spec: TpServeSpec) -> None:
        if ctx.world != spec.tp:
            raise ValueError(f"tp {spec.tp} runs on {spec.tp} ranks, not {ctx.world}")
        self.rank = ctx.rank
        self.spec = spec
        self.device = ctx.device
        group = None
        if spec.tp > 1:
            timeout = timedelta(seconds=ctx.collective_timeout_s)
            group = dist.new_group(list(range(spec.tp)), timeout=timeout)
        self.comm = Comm(ranks=tuple(range(spec.tp)), index=ctx.rank, group=group)
        self.model = self._load(spec.checkpoint)
        kv = self.model.config.kv_spec(
            spec.block_size, spec.num_blocks, self.model.dtype, spec.kv_fp8
        )
        self.cache: KVStore = kv.allocate(self.device)
        self.kv_bytes_per_token = kv.bytes_per_block // spec.block_size

    def ready(self) -> TpReady:
        return TpReady(self.rank, self.kv_bytes_per_token, weight_bytes(self.model))

    def handle(self, message: TpStep | TpLoad) -> TpReply | TpLoaded:
        if isinstance(message, TpLoad):
            self.model = self._load(message.checkpoint, like=self.model)
            return TpLoaded(self.rank, weight_bytes(self.model))
        logits = self.model.forward(message.batch, self.cache)
        return TpReply(logits.cpu() if self.rank == 0 else None)

    def _load(self, checkpoint: str, like: LlamaForCausalLM | None = None) -> LlamaForCausalLM:
        """The checkpoint's weights, loaded whole then sharded; the old shard serves until
        the new one is complete. `like`: the shapes must not change (a weight sync)."""
        loaded = load_model(checkpoint, getattr(torch, self.spec.dtype), self.device)
        if not isinstance(loaded.model, LlamaForCausalLM):
            raise ValueError(
                f"{checkpoint}: tensor parallelism runs the llama family, not "
                f"{loaded.config.model_type}"
            )
        shard = shard_llama(loaded.model, self.comm, self.spec.batch_invariant)
        if like is not None and shard.config != like.config:
            raise ValueError(f"{checkpoint}: a weight sync cannot change the model's shapes")
        return shard


def serve_tp_rank(ctx: RankContext, spec: TpServeSpec, conns: tuple[Connection, ...]) -> int:
    """A TP rank's program (parallel/ranks.py): steps and weight loads from its pipe until the
    engine closes it or sends None."""
    return serve_steps(ctx, conns, lambda: TpRank(ctx, spec))
