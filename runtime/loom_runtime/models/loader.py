"""Load a Hugging Face checkpoint directory into a runnable model, its config and its tokenizer.

Reads files only (config, safetensors, tokenizer); never downloads, and never runs a forward.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from loom_runtime.card import families
from loom_runtime.errors import CheckpointError
from loom_runtime.models.causal_lm import CausalLM, DecoderConfig
from loom_runtime.models.config import read_checkpoint_config
from loom_runtime.models.family import FamilyRuntime, runtime_of
from loom_runtime.wire.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to serve: weights in place, its config and its tokenizer."""

    model: CausalLM
    config: DecoderConfig  # its family's: ModelConfig (llama), SparseMlaConfig, a plugin's
    tokenizer: Tokenizer


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    weights: bool = True,
) -> LoadedModel:
    """Build the model of config.json's family, fill it from the safetensors, load the
    tokenizer. `weights=False`: the model's shapes only, on the meta device, and no tensor file
    read (a parallel engine's own process: its ranks hold the weights)."""
    root = checkpoint_dir(path)
    config = read_config(root)
    tokenizer = read_tokenizer(root, config.vocab_size, config.eos_token_ids)
    model = build_model(config, dtype, device if weights else "meta")
    if weights:
        model.load_state(read_weights(root))
    prepare = decoder_runtime(config.model_type).prepare
    if prepare is not None and weights:
        prepare(model)  # with the model, not in the first request's step
    logger.info(
        "loaded checkpoint",
        extra={"path": str(root), "model_type": config.model_type, "dtype": str(dtype)},
    )
    return LoadedModel(model=model, config=config, tokenizer=tokenizer)


def read_tokenizer(root: Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> Tokenizer:
    """The checkpoint's tokenizer; CheckpointError when it has more tokens than the weights."""
    tokenizer = Tokenizer.from_dir(root, extra_eos_token_ids=eos_token_ids)
    if tokenizer.vocab_size > vocab_size:
        raise CheckpointError(
            f"{root}: tokenizer has {tokenizer.vocab_size} tokens but config.json vocab_size is "
            f"{vocab_size}; the tokenizer does not belong to these weights"
        )
    return tokenizer


def read_config(root: Path) -> DecoderConfig:
    """The config of the checkpoint's family (card/families.py), found by config.json's
    model_type."""
    raw, generation, where = read_checkpoint_config(root)
    read = decoder_runtime(str(raw.get("model_type", "")), where).read_config
    assert read is not None  # decoder_runtime checked
    return read(raw, generation, where)


def build_model(config: DecoderConfig, dtype: torch.dtype, device: str | torch.device) -> CausalLM:
    """An empty (zero-weight) model of the config's family."""
    build = decoder_runtime(config.model_type).build
    assert build is not None  # decoder_runtime checked
    return build(config, dtype, device)


def decoder_runtime(model_type: str, where: str = "config.json") -> FamilyRuntime:
    """The runtime half of the text family that loads `model_type`; CheckpointError when no
    registered family does, or its family is not one the text engine serves."""
    try:
        family = families.family_of_model_type(model_type)
    except families.UnknownFamilyError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    runtime = runtime_of(family)
    if runtime.read_config is None or runtime.build is None:
        raise CheckpointError(f"{where}: the {family.name} family is not served as text")
    return runtime


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (or one .safetensors file), by name, on the CPU.

    Sharded checkpoints are read through model.safetensors.index.json.
    """
    files = weight_files(Path(path))
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            shard = load_file(str(file), device="cpu")
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{file}: cannot read safetensors: {exc}") from exc
        duplicates = sorted(set(shard) & set(tensors))
        if duplicates:
            raise CheckpointError(f"{file}: tensor {duplicates[0]} also appears in another shard")
        tensors.update(shard)
    return tensors


def read_weight_shapes(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint as an empty meta tensor of its shape: what a check of names
    and shapes (`load_state` on a shapes-only model) needs, without reading the data."""
    shapes: dict[str, torch.Tensor] = {}
    for file in weight_files(Path(path)):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    shapes[name] = torch.empty(f.get_slice(name).get_shape(), device="meta")
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{file}: cannot read safetensors: {exc}") from exc
    return shapes


def weight_files(path: Path) -> list[Path]:
    """The safetensors files that make up a checkpoint, in a stable order."""
    if path.is_file():
        return [path]
    root = checkpoint_dir(path)
    index = root / INDEX_FILE
    if index.is_file():
        return _shards_from_index(index)
    if (root / SINGLE_FILE).is_file():
        return [root / SINGLE_FILE]
    found = sorted(root.glob("*.safetensors"))
    if not found:
        raise CheckpointError(
            f"{root}: no weights found (expected {SINGLE_FILE}, {INDEX_FILE} or *.safetensors; "
            "PyTorch .bin checkpoints are not supported: convert them to safetensors)"
        )
    return found


def _shards_from_index(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{index}: not a safetensors index with a weight_map ({exc})"
        ) from exc
    names = sorted(set(weight_map.values()))
    files = [index.parent / name for name in names]
    absent = [name for name, file in zip(names, files, strict=True) if not file.is_file()]
    if absent:
        raise CheckpointError(f"{index}: shard(s) missing from the directory: {', '.join(absent)}")
    return files


def checkpoint_dir(path: str | Path) -> Path:
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a directory: point the model source at a checkpoint")
    return root
