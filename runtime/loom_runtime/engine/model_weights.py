"""The weights an engine serves — in this process (its model) or in its ranks' shards — and
how new ones are read in: from a checkpoint directory or a staged push.

Owns preparing a swap (reading and checking what can be done before the step lock) and the
swap itself; never decides when (the engine calls the swap at a step boundary, drained or, for a
keep swap, under its running requests) and never touches caches or versions (the engine bumps).
"""

from __future__ import annotations

import shutil
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open

from loom_runtime.engine.pushed_weights import (
    model_specs,
    model_tensors,
    staged_checkpoint,
    swap_in,
)
from loom_runtime.engine.ranks.channel import EngineRanks
from loom_runtime.errors import CheckpointError
from loom_runtime.models.causal_lm import CausalLM
from loom_runtime.models.loader import read_weight_shapes, read_weights, weight_files
from loom_runtime.transfer.weight_push import StagedPush
from loom_trainer.protocol import TensorSpec, torch_dtype

Swap = Callable[[], None]
"""A prepared swap: run it under the engine's step lock."""


class CheckpointTensors(Mapping[str, torch.Tensor]):
    """The tensors `specs` names, read from a checkpoint directory one at a time when asked (in
    the spec's dtype): what a worker with ranks sends a restarted peer, without holding a second
    copy of its model (its weights live in the ranks' shards)."""

    def __init__(self, checkpoint: Path, specs: Mapping[str, TensorSpec]) -> None:
        self._checkpoint, self._specs = checkpoint, specs
        self._files: dict[str, Path] | None = None

    def _file_of(self, name: str) -> Path:
        if self._files is None:
            files: dict[str, Path] = {}
            for file in weight_files(self._checkpoint):
                with safe_open(str(file), framework="pt") as f:
                    files.update(dict.fromkeys(f.keys(), file))
            self._files = files
        if name not in self._files:
            raise CheckpointError(f"{self._checkpoint}: no tensor {name} to send")
        return self._files[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        spec = self._specs[name]
        with safe_open(str(self._file_of(name)), framework="pt") as f:
            tensor: torch.Tensor = f.get_tensor(name)
        return tensor.to(torch_dtype(spec.dtype))

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


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
        self._served: Path | None = checkpoint
        """Ranks: the checkpoint directory they hold now (what a peer is sent)."""
        self._kept: weakref.finalize[..., ModelWeights] | None = None
        """Ranks: removes the pushed version's checkpoint kept while it is served."""

    def specs(self) -> dict[str, TensorSpec]:
        """What a pushed version must send: every tensor of the model (name, shape, dtype; a
        parallel worker's whole model, each rank takes its shard)."""
        return model_specs(self._model)

    def tensors(self) -> Mapping[str, torch.Tensor]:
        """The live tensors `specs` describes (what a worker sends a restarted peer); with
        ranks, read from the checkpoint they hold, one tensor at a time."""
        if self._ranks is None:
            return model_tensors(self._model)
        if self._served is None:
            raise CheckpointError(
                "this engine's ranks were started without their checkpoint directory: their "
                "weights live in their shards only, and cannot be sent to a peer"
            )
        return CheckpointTensors(self._served, self.specs())

    def from_checkpoint(self, path: str) -> Swap:
        """Read a checkpoint (here, or only its names and shapes when the ranks load it:
        CheckpointError before anything changes)."""
        if self._ranks is None:
            tensors = read_weights(path)
            return lambda: self._model.load_state(tensors)
        self._model.load_state(read_weight_shapes(path))  # shapes only: nothing is read
        ranks = self._ranks

        def swap() -> None:
            ranks.load_weights(path)
            self._serve(Path(path), None)

        return swap

    def from_push(self, staged: StagedPush) -> Swap:
        """A staged push: copied in bucket by bucket here, or written as a checkpoint beside
        its staging that every rank loads (kept, outside the staging, while it is served: a
        peer may be sent it)."""
        if self._ranks is None:
            return lambda: swap_in(self._model, staged)
        if self._checkpoint is None:
            raise CheckpointError(
                "this engine's ranks were started without their checkpoint directory (its "
                "config and tokenizer): a push cannot be written for them to load"
            )
        checkpoint = staged_checkpoint(staged, self._checkpoint)
        ranks = self._ranks

        def swap() -> None:
            ranks.load_weights(str(checkpoint))
            kept = checkpoint.parent.parent / f"served-{staged.update_id}"
            shutil.rmtree(kept, ignore_errors=True)
            checkpoint.rename(kept)
            self._serve(kept, weakref.finalize(self, shutil.rmtree, kept, ignore_errors=True))

        return swap

    def _serve(self, checkpoint: Path, kept: weakref.finalize[..., ModelWeights] | None) -> None:
        """The ranks hold `checkpoint` now; the pushed one kept before is removed."""
        if self._kept is not None:
            self._kept()
        self._served, self._kept = checkpoint, kept
