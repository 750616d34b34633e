"""Text requests decoded greedily over the paged KV, as the AR loop leaves them before a denoise
step: the cache, each request's block table and the tokens whose K/V it holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from loom_runtime.models.mot.model import MotForCausalLM


def decode_greedily(
    model: MotForCausalLM, paged: Any, prompts: Mapping[str, list[int]], steps: int, seed: int = 0
) -> tuple[Any, dict[str, list[int]]]:
    """Prefill every prompt in one batch, then `steps` batched greedy decode steps: (the paged
    sequences, each request's tokens now in the cache)."""
    seqs = paged(model, block_size=4, seed=seed)
    logits = seqs.step(list(prompts.items()))
    tokens = {name: list(prompt) for name, prompt in prompts.items()}
    for _ in range(steps):
        chosen = {name: int(logits[name][-1].argmax()) for name in prompts}
        for name, token in chosen.items():
            tokens[name].append(token)
        logits = seqs.step([(name, [token]) for name, token in chosen.items()])
    return seqs, tokens


def latents(channels: int, height: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(channels, height, width, generator=torch.Generator().manual_seed(seed)).to(
        torch.float64
    )
