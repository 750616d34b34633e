"""Load a `glm_moe_dsa` checkpoint directory into a SparseMlaForCausalLM and its tokenizer.

Reads files only (config, safetensors, tokenizer); never downloads, and never runs a forward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from loom_runtime.models.loader import checkpoint_dir, read_tokenizer, read_weights
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM
from loom_runtime.wire.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedSparseMla:
    """A sparse-mla model with its weights in place, its config and its tokenizer."""

    model: SparseMlaForCausalLM
    config: SparseMlaConfig
    tokenizer: Tokenizer


def load_sparse_mla(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LoadedSparseMla:
    """Build the model of config.json, fill it (MTP layers included) from the safetensors."""
    root = checkpoint_dir(path)
    config = SparseMlaConfig.from_dir(root)
    tokenizer = read_tokenizer(root, config.vocab_size, config.eos_token_ids)
    model = SparseMlaForCausalLM(config, dtype=dtype, device=device)
    model.load_state(read_weights(root))
    logger.info("loaded sparse-mla checkpoint", extra={"path": str(root), "dtype": str(dtype)})
    return LoadedSparseMla(model=model, config=config, tokenizer=tokenizer)
