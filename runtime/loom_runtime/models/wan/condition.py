"""The DiT's condition embedder: timestep -> adaLN modulation, text features -> the model width.

Owns the time and text projection weights; never sees latents or attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loom_runtime.models.wan.config import WanDitConfig
from loom_runtime.models.wan.params import Linear, wide_dtype

MAX_PERIOD = 10000
MODULATIONS = 6  # shift, scale, gate for self-attention; shift, scale, gate for the FFN


@dataclass(frozen=True)
class Conditions:
    """What every block reads: the time embedding, its modulation table and the text tokens."""

    time: torch.Tensor  # [batch, inner_dim]; also modulates the output norm
    modulation: torch.Tensor  # [batch, 6, inner_dim]
    text: torch.Tensor  # [batch, text_tokens, inner_dim]


def timestep_sinusoids(timestep: torch.Tensor, channels: int) -> torch.Tensor:
    """[batch, channels] cos | sin features of (fractional) timesteps, computed in float32."""
    half = channels // 2
    exponent = -math.log(MAX_PERIOD) * torch.arange(
        half, dtype=torch.float32, device=timestep.device
    )
    angles = timestep.float()[:, None] * torch.exp(exponent / half)[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class ConditionEmbedder:
    """Time MLP (kept wide in half-precision models), time -> 6 modulations, text MLP."""

    def __init__(self, config: WanDitConfig, dtype: torch.dtype, device: str | torch.device):
        dim, wide = config.inner_dim, wide_dtype(dtype)
        self.freq_dim = config.freq_dim
        self.time_1 = Linear(dim, config.freq_dim, wide, device)
        self.time_2 = Linear(dim, dim, wide, device)
        self.time_proj = Linear(MODULATIONS * dim, dim, dtype, device)
        self.text_1 = Linear(dim, config.text_dim, dtype, device)
        self.text_2 = Linear(dim, dim, dtype, device)

    def targets(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, layer in (
            ("time_embedder.linear_1", self.time_1),
            ("time_embedder.linear_2", self.time_2),
            ("time_proj", self.time_proj),
            ("text_embedder.linear_1", self.text_1),
            ("text_embedder.linear_2", self.text_2),
        ):
            out.update(layer.targets(name))
        return out

    def __call__(self, timestep: torch.Tensor, text: torch.Tensor) -> Conditions:
        """timestep [batch] (0..num_train_timesteps), text [batch, tokens, text_dim]."""
        dtype = self.time_proj.weight.dtype
        features = timestep_sinusoids(timestep, self.freq_dim).to(self.time_1.weight.dtype)
        time = self.time_2(F.silu(self.time_1(features))).to(dtype)
        modulation = self.time_proj(F.silu(time)).view(time.shape[0], MODULATIONS, -1)
        text = self.text_2(F.gelu(self.text_1(text.to(dtype)), approximate="tanh"))
        return Conditions(time=time, modulation=modulation, text=text)
