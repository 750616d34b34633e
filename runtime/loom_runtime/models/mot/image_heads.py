"""The denoise path's modality heads: latent patches in (patch embed + timestep embedding) and
the flow-matching velocity out (norm + projection), around the shared transformer stack.

Owns these small weights and the patch layout; never runs the transformer blocks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from loom_runtime.models.linear import Linear, plain_linear
from loom_runtime.models.mot.config import MotConfig
from loom_runtime.models.norm import rms_norm

TIMESTEP_SCALE = 1000.0
"""Flow time t in [0, 1] is embedded as t · 1000, the range diffusion timesteps use."""


def patchify(latents: torch.Tensor, patch: int) -> torch.Tensor:
    """[C, H, W] -> [(H/p)·(W/p), C·p·p]: patches in raster order, each flattened (c, y, x)."""
    c, h, w = latents.shape
    grid = latents.view(c, h // patch, patch, w // patch, patch)
    return grid.permute(1, 3, 0, 2, 4).reshape((h // patch) * (w // patch), c * patch * patch)


def unpatchify(tokens: torch.Tensor, channels: int, height: int, width: int) -> torch.Tensor:
    """The inverse of `patchify`: [(H/p)·(W/p), C·p·p] -> [C, H, W]."""
    patch = math.isqrt(tokens.shape[1] // channels)
    grid = tokens.view(height // patch, width // patch, channels, patch, patch)
    return grid.permute(2, 0, 3, 1, 4).reshape(channels, height, width)


def timestep_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[B] flow times -> [B, dim] sinusoidal features (cos half, then sin half) of t · 1000."""
    half = dim // 2
    exponent = -math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half
    args = (t.to(torch.float64) * TIMESTEP_SCALE)[:, None] * exponent.exp()[None, :]
    return torch.cat((args.cos(), args.sin()), dim=-1).to(t.dtype)


class ImageHeads:
    """Patch embed (Linear C·p² -> hidden), time MLP (Linear, SiLU, Linear), output RMSNorm and
    projection (hidden -> C·p²). Zero weights until `targets()` are filled."""

    def __init__(self, config: MotConfig, dtype: torch.dtype, device: str | torch.device) -> None:
        self.config = config
        h, p, f = config.text.hidden_size, config.patch_dim, config.frequency_dim

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.patch_weight, self.patch_bias = zeros(h, p), zeros(h)
        self.time_weight_1, self.time_bias_1 = zeros(h, f), zeros(h)
        self.time_weight_2, self.time_bias_2 = zeros(h, h), zeros(h)
        self.out_norm = zeros(h)
        self.out_weight, self.out_bias = zeros(p, h), zeros(p)
        self.linear: Linear = plain_linear  # invariant_linear in batch-invariant mode

    def targets(self) -> dict[str, torch.Tensor]:
        """Checkpoint tensor name (below `image.`) -> the tensor it fills."""
        return {
            "patch_embed.weight": self.patch_weight,
            "patch_embed.bias": self.patch_bias,
            "time_embed.linear_1.weight": self.time_weight_1,
            "time_embed.linear_1.bias": self.time_bias_1,
            "time_embed.linear_2.weight": self.time_weight_2,
            "time_embed.linear_2.bias": self.time_bias_2,
            "norm.weight": self.out_norm,
            "proj_out.weight": self.out_weight,
            "proj_out.bias": self.out_bias,
        }

    def embed(self, patches: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Latent tokens [n, hidden]: each patch's embedding plus its request's time embedding
        (`t`: [n], the flow time of each token's request)."""
        x = self.linear(patches, self.patch_weight, self.patch_bias)
        features = timestep_features(t, self.config.frequency_dim)
        time = self.linear(features, self.time_weight_1, self.time_bias_1)
        return x + self.linear(F.silu(time), self.time_weight_2, self.time_bias_2)

    def velocity(self, x: torch.Tensor) -> torch.Tensor:
        """The stack's output tokens [n, hidden] -> predicted velocity patches [n, C·p²]."""
        h = rms_norm(x, self.out_norm, self.config.text.rms_norm_eps)
        return self.linear(h, self.out_weight, self.out_bias)
