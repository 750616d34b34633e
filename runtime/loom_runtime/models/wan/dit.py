"""WanDiT: the Wan 2.x video diffusion transformer (a single-frame latent is an image).

Patchify -> blocks -> modulated output norm -> unpatchify, predicting the flow velocity;
owns the weights and one forward; never steps a sampler, schedules or reads files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from loom_runtime.errors import InvalidRequestError
from loom_runtime.models.wan.condition import ConditionEmbedder
from loom_runtime.models.wan.config import WanDitConfig
from loom_runtime.models.wan.dit_block import WanBlock, layer_norm
from loom_runtime.models.wan.params import Linear, wide_dtype
from loom_runtime.models.wan.rotary import grid_rotary
from loom_runtime.models.weights import copy_weights


class WanDiT:
    """diffusers `WanTransformer3DModel` as plain tensors. Zeros until `load_state`; no autograd."""

    def __init__(
        self,
        config: WanDitConfig,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = config
        dim, wide = config.inner_dim, wide_dtype(dtype)
        self.patch_weight = torch.zeros(
            dim, config.in_channels, *config.patch_size, dtype=dtype, device=device
        )
        self.patch_bias = torch.zeros(dim, dtype=dtype, device=device)
        self.conditions = ConditionEmbedder(config, dtype, device)
        self.blocks = [WanBlock(config, dtype, device) for _ in range(config.num_layers)]
        self.proj_out = Linear(
            config.out_channels * math.prod(config.patch_size), dim, dtype, device
        )
        self.out_modulation = torch.zeros(1, 2, dim, dtype=wide, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_weight.device

    def token_grid(self, latent_shape: tuple[int, ...]) -> tuple[int, int, int]:
        """(frames, rows, columns) of tokens of latents [batch, channels, frames, height, width]"""
        c = self.config
        if len(latent_shape) != 5 or latent_shape[1] != c.in_channels:
            raise InvalidRequestError(
                f"latents must be [batch, {c.in_channels}, frames, height, width], "
                f"got {list(latent_shape)}"
            )
        sizes = latent_shape[2:]
        if any(n % p for n, p in zip(sizes, c.patch_size, strict=True)):
            raise InvalidRequestError(
                f"latent frames/height/width {list(sizes)} must be multiples of the patch "
                f"{list(c.patch_size)}: pick a size divisible by the patch x VAE scale"
            )
        t, h, w = (n // p for n, p in zip(sizes, c.patch_size, strict=True))
        return t, h, w

    @torch.inference_mode()
    def forward(
        self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor
    ) -> torch.Tensor:
        """The predicted velocity, shaped like latents [batch, channels, frames, height, width].

        timestep: [batch] floats in 0..num_train_timesteps; text: [batch, tokens, text_dim],
        the text encoder's features (padded with zeros to a fixed length, as Wan pipelines do).
        """
        c = self.config
        grid = self.token_grid(tuple(latents.shape))
        rotary = grid_rotary(grid, c.rope_axes, c.rope_max_seq_len, self.device)
        x = F.conv3d(
            latents.to(self.dtype), self.patch_weight, self.patch_bias, stride=c.patch_size
        )
        x = x.flatten(2).transpose(1, 2).contiguous()  # [batch, tokens, dim], (t, h, w) order
        cond = self.conditions(timestep.to(self.device), text.to(self.device))
        for block in self.blocks:
            x = block(x, cond.text, cond.modulation, rotary)
        shift, scale = (
            self.out_modulation + cond.time.unsqueeze(1).to(self.out_modulation)
        ).unbind(1)
        x = (layer_norm(x, c.eps) * (1 + scale[:, None]) + shift[:, None]).to(self.dtype)
        return self._unpatchify(self.proj_out(x), grid)

    def _unpatchify(self, x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """[batch, tokens, pt*ph*pw*channels] -> [batch, channels, frames, height, width]."""
        pt, ph, pw = self.config.patch_size
        t, h, w = grid
        x = x.reshape(x.shape[0], t, h, w, pt, ph, pw, -1)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(x.shape[0], x.shape[1], t * pt, h * ph, w * pw)

    def targets(self) -> dict[str, torch.Tensor]:
        """Every diffusers tensor name this model reads -> the tensor it fills."""
        out = {
            "patch_embedding.weight": self.patch_weight,
            "patch_embedding.bias": self.patch_bias,
            "scale_shift_table": self.out_modulation,
        }
        out.update({f"condition_embedder.{k}": v for k, v in self.conditions.targets().items()})
        for i, block in enumerate(self.blocks):
            out.update({f"blocks.{i}.{k}": v for k, v in block.targets().items()})
        out.update(self.proj_out.targets("proj_out"))
        return out

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy checkpoint tensors in place; validates all names and shapes first (atomic)."""
        copy_weights(self.targets(), tensors, "wan transformer", strict)
