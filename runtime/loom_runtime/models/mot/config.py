"""MotConfig: a MoT checkpoint's config.json: the llama text stack's fields plus an `image` block
(latent channels, patch size, timestep frequencies) for the denoise path's heads.

Parses and validates once, collecting every problem; never touches weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from loom_runtime.errors import CheckpointError
from loom_runtime.kv.cache import KVCacheSpec
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.config import ModelConfig, positive_int

MODEL_TYPE = "loom_mot"
TEXT_MODEL_TYPE = "llama"
"""The text stack is a llama decoder: its fields in config.json are llama's."""


@dataclass(frozen=True)
class MotConfig:
    """A llama text stack (`text`) and the image heads around the same stack."""

    text: ModelConfig
    latent_channels: int
    """Channels of an image latent [C, H, W] (a VAE's output)."""
    patch_size: int
    """Latent pixels per patch side: one latent token per patch_size² pixels."""
    frequency_dim: int
    """Sinusoidal features of the timestep before the time embedding's MLP (even)."""
    model_type: str = MODEL_TYPE

    @property
    def patch_dim(self) -> int:
        """Features of one flattened patch: latent_channels · patch_size²."""
        return self.latent_channels * self.patch_size**2

    @property
    def vocab_size(self) -> int:
        return self.text.vocab_size

    @property
    def max_position_embeddings(self) -> int:
        return self.text.max_position_embeddings

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.text.eos_token_ids

    @property
    def num_parameters(self) -> int:
        """The text stack's parameters plus the image heads' (patch embed, time MLP, norm, out)."""
        h, p, f = self.text.hidden_size, self.patch_dim, self.frequency_dim
        heads = (p * h + h) + (f * h + h) + (h * h + h) + h + (h * p + p)
        return self.text.num_parameters + heads

    def kv_spec(
        self,
        block_size: int,
        num_blocks: int,
        dtype: torch.dtype = torch.float32,
        fp8: Fp8Format | None = None,
    ) -> KVCacheSpec:
        """The text stack's paged KV: only text tokens are cached (latents never are)."""
        return self.text.kv_spec(block_size, num_blocks, dtype, fp8)

    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        generation: Mapping[str, Any] | None = None,
        where: str = "config.json",
    ) -> MotConfig:
        """Build from config.json contents; raises CheckpointError listing every problem."""
        errors: list[str] = []
        if raw.get("model_type") != MODEL_TYPE:
            errors.append(f"model_type {raw.get('model_type')!r} is not {MODEL_TYPE!r}")
        image = raw.get("image")
        if not isinstance(image, Mapping):
            errors.append("image must be an object (latent_channels, patch_size, frequency_dim)")
            image = {}
        ints = {
            name: positive_int(image, name, errors)
            for name in ("latent_channels", "patch_size", "frequency_dim")
        }
        if ints["frequency_dim"] % 2:
            errors.append(f"image.frequency_dim must be even, got {ints['frequency_dim']}")
        try:
            text = ModelConfig.from_dict({**raw, "model_type": TEXT_MODEL_TYPE}, generation, where)
        except CheckpointError as exc:
            errors.append(str(exc).removeprefix(f"{where}: "))
        if errors:
            raise CheckpointError(f"{where}: " + "; ".join(errors))
        return cls(
            text=text,
            latent_channels=ints["latent_channels"],
            patch_size=ints["patch_size"],
            frequency_dim=ints["frequency_dim"],
        )
