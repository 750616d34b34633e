"""DenoiseBatch: one denoise step of several requests, each its noisy latents, its flow time and
where its text KV lies in the paged cache (written by its AR decoding, read here, never rewritten).

A plain frozen record and its checks; never runs a forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loom_runtime.models.mot.config import MotConfig


@dataclass(frozen=True)
class DenoiseRequest:
    """One request's step: latents x_t at flow time t (1 = noise, 0 = image) and its text KV."""

    latents: torch.Tensor  # [C, H, W], H and W multiples of the patch size
    timestep: float  # flow time t in [0, 1]
    context_len: int  # text tokens of the request in the cache (0: unconditional)
    block_table: list[int]  # its KV blocks, as the AR loop's table holds them


@dataclass(frozen=True)
class DenoiseBatch:
    requests: tuple[DenoiseRequest, ...]

    def check(self, config: MotConfig, block_size: int) -> None:
        """ValueError naming the request whose latents or text KV do not fit the model."""
        patch, channels = config.patch_size, config.latent_channels
        for i, r in enumerate(self.requests):
            c, h, w = r.latents.shape if r.latents.dim() == 3 else (0, 0, 0)
            if c != channels or h < patch or w < patch or h % patch or w % patch:
                raise ValueError(
                    f"DenoiseBatch request {i}: latents {tuple(r.latents.shape)} must be "
                    f"[{channels}, H, W] with H and W positive multiples of {patch}"
                )
            if not 0.0 <= r.timestep <= 1.0:
                raise ValueError(f"DenoiseBatch request {i}: timestep {r.timestep} not in [0, 1]")
            if r.context_len < 0 or len(r.block_table) * block_size < r.context_len:
                raise ValueError(
                    f"DenoiseBatch request {i}: context_len {r.context_len} does not fit its "
                    f"{len(r.block_table)} blocks of {block_size}"
                )

    def token_counts(self, patch: int) -> list[int]:
        """Latent tokens of each request: (H/p)·(W/p)."""
        return [
            (r.latents.shape[1] // patch) * (r.latents.shape[2] // patch) for r in self.requests
        ]
