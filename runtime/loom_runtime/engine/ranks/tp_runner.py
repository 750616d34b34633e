"""The TP runner: ModelRunner's interface over the rank processes of a tensor-parallel llama
worker. The engine schedules, allocates blocks and samples in its own process as on one rank;
each step's works become one ForwardBatch here (the one ModelRunner builds), every rank runs
it on its head shard over its own pool — the engine's block tables name the same blocks in
every rank's pool, so prefix caching and preemption need nothing from the ranks — and rank 0
sends back the logits rows.

Owns the rank group's lifetime (engine/ranks/channel.py), the step exchange and its timeout,
and each rank's KV figures; never schedules, samples or changes a block table. A rank that
dies, raises or does not answer in time takes the runner down with RankFailure.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.ranks.channel import START_TIMEOUT_S, RankChannel, rank_config
from loom_runtime.engine.runner import TokenWork, build_forward_batch, logits_per_work
from loom_runtime.engine.types import RankKVStats
from loom_runtime.kv.latent_cache import LatentKVCache
from loom_runtime.models.config import ModelConfig
from loom_runtime.parallel.llama.tp import shard_config
from loom_runtime.parallel.llama.tp_server import (
    TpLoad,
    TpLoaded,
    TpReady,
    TpReply,
    TpServeSpec,
    TpStep,
    serve_tp_rank,
)
from loom_runtime.parallel.ranks import RankConfig

logger = logging.getLogger(__name__)


class TpRunner:
    """Start with the spec; `execute` as ModelRunner; `close` at shutdown. Not thread-safe:
    the engine's step thread is its one caller."""

    export_rows = False  # every rank keeps its own pool: the engine's only counts blocks

    def __init__(
        self,
        spec: TpServeSpec,
        config: RankConfig,
        workdir: Path | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if config.world != spec.tp:
            raise ValueError(f"TpRunner: tp {spec.tp} needs {spec.tp} ranks, not {config.world}")
        self.spec = spec
        self.block_size = spec.block_size
        self.num_blocks: int | None = spec.num_blocks
        self.tokens_run = 0
        self.forwards = 0
        self._timeout_s = config.collective_timeout_s
        self._lengths: dict[str, int] = {}  # tokens each live request has on the ranks
        self._ranks = RankChannel(config, serve_tp_rank, (spec,), workdir)
        ready = self._ranks.receive_all(TpReady, "start", start_timeout_s)
        self.weight_bytes = [r.weight_bytes for r in ready]
        self._per_token = [r.kv_bytes_per_token for r in ready]
        logger.info("tp ranks ready", extra={"tp": spec.tp, "pids": self._ranks.pids})

    @property
    def world(self) -> int:
        return self._ranks.world

    @property
    def pids(self) -> list[int]:
        return self._ranks.pids

    def execute(self, works: Sequence[TokenWork]) -> list[torch.Tensor | None]:
        """One forward on every rank; per work its logits row ([vocab]) or None."""
        batch = build_forward_batch(works, self.block_size, torch.device("cpu"))
        self._ranks.send_all(TpStep(batch))
        replies = self._ranks.receive_all(TpReply, "step", self._timeout_s)
        for w in works:
            self._lengths[w.request_id] = w.end
        self.tokens_run += batch.num_tokens
        self.forwards += 1
        logits = replies[0].logits
        if logits is None:
            self._ranks.fail("rank 0 sent no logits")
        return logits_per_work(works, logits)

    def release(self, request_id: str) -> None:
        """The request's blocks were freed (its rows stay in the pools until reused)."""
        self._lengths.pop(request_id, None)

    def flush(self) -> None:
        """Nothing is pending: the ranks keep no per-request state."""

    def kv(self) -> tuple[RankKVStats, ...]:
        """Per rank, its kv heads' share of every live request's rows."""
        bs = self.block_size
        tokens = sum(self._lengths.values())
        blocks = sum(-(-n // bs) for n in self._lengths.values())
        return tuple(
            RankKVStats(rank, per, tokens, blocks * bs * per, len(self._lengths))
            for rank, per in enumerate(self._per_token)
        )

    def mirror_into(self, cache: LatentKVCache) -> None:
        raise ValueError("TP ranks keep their own pools; there are no rows to mirror")

    def load_weights(self, checkpoint: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Every rank loads and re-shards the checkpoint (the caller checked its names and
        shapes first). A rank that fails takes the runner down."""
        self._ranks.send_all(TpLoad(checkpoint))
        loaded = self._ranks.receive_all(TpLoaded, "weight load", timeout_s)
        self.weight_bytes = [r.weight_bytes for r in loaded]

    def close(self, timeout_s: float = 10.0) -> None:
        self._ranks.close(timeout_s)


def tp_num_blocks(model: ModelConfig, config: EngineConfig, max_model_len: int) -> int:
    """Blocks of the pool every rank (and the engine's count) has: kv_cache_bytes is per rank,
    and a rank's block holds its kv heads only."""
    shard = shard_config(model, config.parallel.tp)
    per_block = shard.kv_spec(config.block_size, 1, config.dtype, config.kv_fp8).bytes_per_block
    return config.resolve_num_blocks(per_block, max_model_len)


def start_tp(
    checkpoint: str, model: ModelConfig, config: EngineConfig, max_model_len: int
) -> TpRunner:
    """The TP ranks of a llama engine whose config asks for tp > 1."""
    spec = TpServeSpec(
        checkpoint=checkpoint,
        tp=config.parallel.tp,
        dtype=str(config.dtype).removeprefix("torch."),
        block_size=config.block_size,
        num_blocks=tp_num_blocks(model, config, max_model_len),
        kv_fp8=config.kv_fp8,
        batch_invariant=config.batch_invariant,
    )
    return TpRunner(spec, rank_config(config))
