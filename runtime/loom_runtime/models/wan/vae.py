"""WanVaeDecoder: the Wan 2.1 / 2.2 VAE's causal 3D decoder, latents -> pixels in [-1, 1].

Decodes one latent frame per chunk through a CausalCache (as diffusers does; several videos'
chunks in one call through a BatchedCausalCache), or a whole video; owns the decoder's weights;
never encodes, tiles spatially or reads files.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from loom_runtime.models.wan.config import WanVaeConfig
from loom_runtime.models.wan.vae_blocks import (
    CausalConv3d,
    ChannelNorm,
    FrameAttention,
    ResidualBlock,
    Upsampler,
    duplicate_up,
    unpatchify,
)
from loom_runtime.models.wan.vae_cache import CausalCache, ChunkCache, SlotCounter
from loom_runtime.models.weights import copy_weights


class UpBlock:
    """num_res_blocks + 1 residual blocks, then (except at the last level) an upsampler.

    Wan 2.1's upsampler halves the width; Wan 2.2's (residual) keeps it and adds the block's
    input back through a duplicating shortcut.
    """

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        config: WanVaeConfig,
        upsample: str | None,
        dtype: torch.dtype,
        device: str | torch.device,
        slots: SlotCounter,
    ) -> None:
        widths = [in_ch] + [out_ch] * (config.num_res_blocks + 1)
        self.resnets = [
            ResidualBlock(a, b, dtype, device, slots) for a, b in itertools.pairwise(widths)
        ]
        temporal = upsample == "temporal"
        up_out = out_ch if config.is_residual else out_ch // 2
        self.upsampler = (
            None if upsample is None else Upsampler(out_ch, up_out, temporal, dtype, device, slots)
        )
        self.shortcut = (
            (out_ch, 2 if temporal else 1) if config.is_residual and upsample is not None else None
        )  # (channels, frames per input frame) of the duplicating shortcut

    def targets(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for i, resnet in enumerate(self.resnets):
            out.update({f"resnets.{i}.{k}": v for k, v in resnet.targets().items()})
        if self.upsampler is not None:
            name = "upsampler" if self.shortcut is not None else "upsamplers.0"
            out.update({f"{name}.{k}": v for k, v in self.upsampler.targets().items()})
        return out

    def __call__(
        self, x: torch.Tensor, cache: ChunkCache | None, first_chunk: bool
    ) -> torch.Tensor:
        skip = x
        for resnet in self.resnets:
            x = resnet(x, cache)
        if self.upsampler is not None:
            x = self.upsampler(x, cache)
        if self.shortcut is not None:
            x = x + duplicate_up(skip, *self.shortcut, first_chunk)
        return x


class WanVaeDecoder:
    """diffusers `AutoencoderKLWan`'s post_quant_conv + decoder as plain tensors; no autograd."""

    def __init__(
        self,
        config: WanVaeConfig,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = config
        slots = SlotCounter()
        z, base, mult = config.z_dim, config.decoder_base_dim, config.dim_mult
        widths = [base * m for m in (mult[-1], *mult[::-1])]
        self.post_quant = CausalConv3d(z, z, (1, 1, 1), dtype, device, None)
        self.conv_in = CausalConv3d(z, widths[0], (3, 3, 3), dtype, device, slots)
        self.mid_resnets = [
            ResidualBlock(widths[0], widths[0], dtype, device, slots) for _ in range(2)
        ]
        self.mid_attention = FrameAttention(widths[0], dtype, device)
        self.up_blocks: list[UpBlock] = []
        levels = len(mult)
        for i in range(levels):
            halved = i > 0 and not config.is_residual  # a Wan 2.1 upsampler halves the width
            in_ch = widths[i] // 2 if halved else widths[i]
            last = i == levels - 1
            upsample = None if last else "temporal" if config.temporal_upsample[i] else "spatial"
            self.up_blocks.append(
                UpBlock(in_ch, widths[i + 1], config, upsample, dtype, device, slots)
            )
        self.norm_out = ChannelNorm(widths[-1], 3, dtype, device)
        self.conv_out = CausalConv3d(
            widths[-1], config.out_channels, (3, 3, 3), dtype, device, slots
        )
        self.cache_slots = slots.count

    @property
    def dtype(self) -> torch.dtype:
        return self.conv_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.conv_in.weight.device

    def new_cache(self) -> CausalCache:
        """An empty cache for one video's chunked decode."""
        return CausalCache(self.cache_slots)

    def output_frames(self, latent_frames: int) -> int:
        """Video frames decoded from `latent_frames` latent frames (1 + 4 (n - 1) for Wan)."""
        return 1 + self.config.scale_factor_temporal * (latent_frames - 1)

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Pixels [batch, 3, frames, H * s, W * s] (s = scale_factor_spatial) in [-1, 1] of latents
        [batch, z_dim, latent_frames, H, W], one latent frame per chunk (as diffusers decodes).

        Latents are the VAE's own (already un-normalized with latents_mean / latents_std).
        """
        cache = self.new_cache()
        chunks = [
            self.decode_chunk(latents[:, :, i : i + 1], cache) for i in range(latents.shape[2])
        ]
        cache.clear()
        return torch.cat(chunks, dim=2)

    @torch.inference_mode()
    def decode_chunk(self, latents: torch.Tensor, cache: ChunkCache | None) -> torch.Tensor:
        """The video frames of the next latent frame(s), clamped to [-1, 1].

        With a cache, call it for consecutive chunks of one video (or, with a BatchedCausalCache,
        of several videos at once, one batch row each: no op mixes rows); without, `latents` is
        the whole video.
        """
        first_chunk = cache is None or cache.first_chunk
        x = self.post_quant(latents.to(self.device, self.dtype))
        x = self.conv_in(x, cache)
        x = self.mid_resnets[0](x, cache)
        x = self.mid_resnets[1](self.mid_attention(x), cache)
        for block in self.up_blocks:
            x = block(x, cache, first_chunk)
        x = self.conv_out(F.silu(self.norm_out(x)), cache)
        if cache is not None:
            cache.advance()
        return unpatchify(x, self.config.patch_size).clamp(-1.0, 1.0)

    def unscale_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The DiT's normalized latents -> the VAE's: latents * std + mean, per channel."""
        shape = (1, self.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.config.latents_mean, dtype=latents.dtype, device=latents.device)
        std = torch.tensor(self.config.latents_std, dtype=latents.dtype, device=latents.device)
        return latents * std.view(shape) + mean.view(shape)

    def targets(self) -> dict[str, torch.Tensor]:
        """Every diffusers tensor name of the decoder side -> the tensor it fills."""
        out = self.post_quant.targets("post_quant_conv")
        decoder = self.conv_in.targets("conv_in")
        for i, resnet in enumerate(self.mid_resnets):
            decoder.update({f"mid_block.resnets.{i}.{k}": v for k, v in resnet.targets().items()})
        attention = self.mid_attention.targets()
        decoder.update({f"mid_block.attentions.0.{k}": v for k, v in attention.items()})
        for i, block in enumerate(self.up_blocks):
            decoder.update({f"up_blocks.{i}.{k}": v for k, v in block.targets().items()})
        decoder["norm_out.gamma"] = self.norm_out.gamma
        decoder.update(self.conv_out.targets("conv_out"))
        out.update({f"decoder.{k}": v for k, v in decoder.items()})
        return out

    def load_state(self, tensors: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Copy the decoder-side tensors in place (atomic). Pass only decoder-side names:
        the loader checks and sets aside the encoder's (see vae_layout.encoder_shapes)."""
        copy_weights(self.targets(), tensors, "wan vae decoder", strict)
