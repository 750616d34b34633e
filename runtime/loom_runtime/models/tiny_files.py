"""The files of a generated tiny checkpoint: random weights from a seed, tokenizer, configs.

Writes one directory deterministically (same seed -> same bytes); never downloads anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from loom_runtime.models.tiny_tokenizer import TinyTokenizer, tokenizer_config

CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
)


def random_weights(
    shapes: Mapping[str, tuple[int, ...]], seed: int, std: float
) -> dict[str, torch.Tensor]:
    """N(0, std) tensors and unit norm weights, drawn in sorted-name order from one generator."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shapes[name])
        else:
            weights[name] = torch.randn(shapes[name], generator=generator) * std
    return weights


def write_checkpoint(
    root: Path,
    config: Mapping[str, Any],
    weights: Mapping[str, torch.Tensor],
    tiny: TinyTokenizer,
    eos_ids: list[int],
    readme: str,
) -> Path:
    """Write the CHECKPOINT_FILES into `root` (created if needed)."""
    root.mkdir(parents=True, exist_ok=True)
    save_file(dict(weights), str(root / "model.safetensors"), {"format": "pt"})
    tiny.tokenizer.save(str(root / "tokenizer.json"), pretty=True)
    generation = {"bos_token_id": tiny.bos_id, "eos_token_id": eos_ids, "do_sample": False}
    for name, data in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config()),
        ("generation_config.json", generation),
    ):
        (root / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", "utf-8")
    (root / "README.md").write_text(readme, "utf-8")
    return root
