"""The weights an engine serves — in this process (its model) or in its ranks' shards — and
how new ones are read in: from a checkpoint directory or a staged push.

Owns preparing a swap (reading and checking what can be done before the step lock) and the
swap itself; never decides when (the engine calls the swap at a step boundary, drained or, for a
keep swap, under its running requests) and never touches caches or versions (the engine bumps).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from loom_runtime.engine.pushed_weights import (
    model_specs,
    model_tensors,
    staged_checkpoint,
    swap_in,
)
from loom_runtime.engine.ranks.channel import EngineRanks
from loom_runtime.errors import CheckpointError
from loom_runtime.models.causal_lm import CausalLM
from loom_runtime.models.loader import read_weight_shapes, read_weights
from loom_runtime.transfer.weight_push import StagedPush
from loom_trainer.protocol import TensorSpec

Swap = Callable[[], None]
"""A prepared swap: run it under the engine's step lock."""


class ModelWeights:
    """One engine's weights. `checkpoint`: the directory a parallel engine's ranks started
    from (a push becomes a checkpoint beside it for them); None without ranks, or for ranks
    started by hand (they then take checkpoints, not pushes)."""

    def __init__(
        self, model: CausalLM, ranks: EngineRanks | None, checkpoint: Path | None = None
    ) -> None:
        self._model = model
        self._ranks = ranks
        self._checkpoint = checkpoint

    def specs(self) -> dict[str, TensorSpec]:
        """What a pushed version must send: every tensor of the model (name, shape, dtype; a
        parallel worker's whole model, each rank takes its shard)."""
        return model_specs(self._model)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The live tensors `specs` describes (what a worker sends a restarted peer)."""
        if self._ranks is not None:
            raise CheckpointError(
                "a parallel (TP/EP/PCP/DCP) worker's weights live in its ranks' shards: it "
                "cannot send them to a peer"
            )
        return model_tensors(self._model)

    def from_checkpoint(self, path: str) -> Swap:
        """Read a checkpoint (here, or only its names and shapes when the ranks load it:
        CheckpointError before anything changes)."""
        if self._ranks is None:
            tensors = read_weights(path)
            return lambda: self._model.load_state(tensors)
        self._model.load_state(read_weight_shapes(path))  # shapes only: nothing is read
        ranks = self._ranks
        return lambda: ranks.load_weights(path)

    def from_push(self, staged: StagedPush) -> Swap:
        """A staged push: copied in bucket by bucket here, or written as a checkpoint beside
        its staging that every rank loads."""
        if self._ranks is None:
            return lambda: swap_in(self._model, staged)
        if self._checkpoint is None:
            raise CheckpointError(
                "this engine's ranks were started without their checkpoint directory (its "
                "config and tokenizer): a push cannot be written for them to load"
            )
        checkpoint = str(staged_checkpoint(staged, self._checkpoint))
        ranks = self._ranks
        return lambda: ranks.load_weights(checkpoint)
