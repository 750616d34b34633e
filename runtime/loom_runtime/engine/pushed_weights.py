"""Pushed weights and the model: what a push must send (every tensor's name, shape and dtype)
and swapping a staged push in, one bucket at a time — or, for a worker whose ranks hold the
weights, the staged push written as a checkpoint directory the ranks load like any other.

Owns the model side of a push; never receives bytes (transfer/weight_push.py does) and never
decides when to swap (the engine calls it at a step boundary, drained).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from loom_runtime.errors import CheckpointError
from loom_runtime.transfer.weight_push import StagedPush
from loom_trainer.protocol import TensorSpec, spec_of


def model_specs(model: Any) -> dict[str, TensorSpec]:
    """Every tensor the model reads, by Hugging Face name (what a push must send)."""
    return {name: spec_of(name, t) for name, t in model_tensors(model).items()}


def model_tensors(model: Any) -> dict[str, torch.Tensor]:
    """Every tensor the model reads, by Hugging Face name: the live tensors a push fills, and
    what a worker sends a restarted peer (transfer/peer_rebuild.py)."""
    targets = getattr(model, "targets", None)
    if targets is None:
        raise CheckpointError(
            f"{type(model).__name__} does not list its tensors (targets()): pushing weights "
            "into this model family is not built; load a checkpoint with LoadWeights instead"
        )
    return dict(targets())


def swap_in(model: Any, staged: StagedPush) -> None:
    """Copy every staged bucket into the model in place (names, shapes and dtypes were checked
    before the push moved a byte; one bucket is read from disk at a time)."""
    for tensors in staged.tensors():
        model.load_state(tensors, strict=False)


INDEX = "model.safetensors.index.json"


def staged_checkpoint(staged: StagedPush, like: Path) -> Path:
    """The staged push as a checkpoint directory inside its staging (deleted with it): each
    bucket one safetensors shard, an index naming each tensor's shard, and `like`'s other files
    (config, tokenizer) linked. What a worker's ranks load, each taking its own shard; reads
    one bucket at a time (with one copy of it while its shard is written)."""
    out = staged.directory / "checkpoint"
    shutil.rmtree(out, ignore_errors=True)  # a swap tried before (and refused) wrote one
    out.mkdir()
    weight_map: dict[str, str] = {}
    count = len(staged.buckets)
    for i, tensors in enumerate(staged.tensors()):
        shard = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        save_file({n: t.clone() for n, t in tensors.items()}, str(out / shard))
        weight_map.update(dict.fromkeys(tensors, shard))
    (out / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for f in like.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != INDEX:
            (out / f.name).symlink_to(f.resolve())
    return out
