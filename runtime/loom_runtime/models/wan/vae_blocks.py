"""The Wan VAE decoder's layers: causal 3D convolution, channel RMS norm, residual block, the
middle attention block and the spatial / spatio-temporal upsamplers.

Each layer owns its weights and streams frames through a ChunkCache (every op keeps the batch
rows apart, so one cache may hold several videos); never reads files.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from loom_runtime.models.wan.params import wide_dtype
from loom_runtime.models.wan.vae_cache import ChunkCache, SlotCounter

Device = str | torch.device


class CausalConv3d:
    """Conv3d zero-padded in space and only on the past side in time (kernel - 1 frames).

    With a cache slot, the past frames come from the previous chunk instead of zeros.
    """

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        kernel: tuple[int, int, int],
        dtype: torch.dtype,
        device: Device,
        slots: SlotCounter | None,
    ) -> None:
        self.weight = torch.zeros(out_ch, in_ch, *kernel, dtype=dtype, device=device)
        self.bias = torch.zeros(out_ch, dtype=dtype, device=device)
        self.past = kernel[0] - 1
        self.padding = (0, kernel[1] // 2, kernel[2] // 2)
        self.slot = slots.take() if slots is not None and self.past else None

    def targets(self, name: str) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": self.weight, f"{name}.bias": self.bias}

    def __call__(self, x: torch.Tensor, cache: ChunkCache | None = None) -> torch.Tensor:
        if self.past:
            history = None if cache is None or self.slot is None else cache.read(self.slot)
            if history is None:
                history = x.new_zeros(*x.shape[:2], self.past, *x.shape[3:])
            x = torch.cat([history, x], dim=2)
            if cache is not None and self.slot is not None:
                cache.write(self.slot, x[:, :, -self.past :])  # the cache keeps a copy
        return F.conv3d(x, self.weight, self.bias, padding=self.padding)


class ChannelNorm:
    """RMS norm across channels (dim 1) of each pixel: x / ||x|| * sqrt(C) * gamma."""

    def __init__(self, channels: int, spatial_dims: int, dtype: torch.dtype, device: Device):
        self.gamma = torch.zeros(channels, *([1] * spatial_dims), dtype=dtype, device=device)
        self.scale = math.sqrt(channels)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        normalized: torch.Tensor = F.normalize(x.to(wide_dtype(x.dtype)), dim=1).to(x.dtype)
        return normalized * self.scale * self.gamma


class ResidualBlock:
    """x -> conv2(silu(norm2(conv1(silu(norm1 x))))) + shortcut(x) (1x1x1 when widths differ)."""

    def __init__(
        self, in_ch: int, out_ch: int, dtype: torch.dtype, device: Device, slots: SlotCounter
    ) -> None:
        self.norm1 = ChannelNorm(in_ch, 3, dtype, device)
        self.conv1 = CausalConv3d(in_ch, out_ch, (3, 3, 3), dtype, device, slots)
        self.norm2 = ChannelNorm(out_ch, 3, dtype, device)
        self.conv2 = CausalConv3d(out_ch, out_ch, (3, 3, 3), dtype, device, slots)
        self.shortcut = (
            CausalConv3d(in_ch, out_ch, (1, 1, 1), dtype, device, None) if in_ch != out_ch else None
        )

    def targets(self) -> dict[str, torch.Tensor]:
        out = {"norm1.gamma": self.norm1.gamma, "norm2.gamma": self.norm2.gamma}
        out.update(self.conv1.targets("conv1"))
        out.update(self.conv2.targets("conv2"))
        if self.shortcut is not None:
            out.update(self.shortcut.targets("conv_shortcut"))
        return out

    def __call__(self, x: torch.Tensor, cache: ChunkCache | None) -> torch.Tensor:
        skip = x if self.shortcut is None else self.shortcut(x)
        x = self.conv1(F.silu(self.norm1(x)), cache)
        x = self.conv2(F.silu(self.norm2(x)), cache)
        return x + skip


class FrameAttention:
    """Single-head self-attention over the pixels of each frame (the middle block's)."""

    def __init__(self, channels: int, dtype: torch.dtype, device: Device) -> None:
        self.norm = ChannelNorm(channels, 2, dtype, device)
        self.qkv_weight = torch.zeros(3 * channels, channels, 1, 1, dtype=dtype, device=device)
        self.qkv_bias = torch.zeros(3 * channels, dtype=dtype, device=device)
        self.proj_weight = torch.zeros(channels, channels, 1, 1, dtype=dtype, device=device)
        self.proj_bias = torch.zeros(channels, dtype=dtype, device=device)

    def targets(self) -> dict[str, torch.Tensor]:
        return {
            "norm.gamma": self.norm.gamma,
            "to_qkv.weight": self.qkv_weight,
            "to_qkv.bias": self.qkv_bias,
            "proj.weight": self.proj_weight,
            "proj.bias": self.proj_bias,
        }

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)
        qkv = F.conv2d(self.norm(frames), self.qkv_weight, self.qkv_bias)
        pixels = qkv.flatten(2).transpose(1, 2).unsqueeze(1).contiguous()  # [b*t, 1, h*w, 3c]
        q, k, v = pixels.chunk(3, dim=-1)
        attn = F.scaled_dot_product_attention(q, k, v).squeeze(1).transpose(1, 2)
        # contiguous: a channels-last-strided input takes a float64 conv path whose sums
        # depend on the batch, and several videos' frames may share this batch
        attn = attn.reshape(b * t, c, h, w).contiguous()
        out = F.conv2d(attn, self.proj_weight, self.proj_bias)
        return x + out.view(b, t, c, h, w).transpose(1, 2)


class Upsampler:
    """Doubles height and width (nearest, then a 3x3 conv to `out_channels`); the temporal kind
    first doubles the frames with a causal (3, 1, 1) conv whose output halves interleave.

    The temporal conv starts at the second frame: the first frame of a video passes through
    alone (a Wan latent's first frame stands for one video frame, the others for four).
    """

    def __init__(
        self,
        channels: int,
        out_channels: int,
        temporal: bool,
        dtype: torch.dtype,
        device: Device,
        slots: SlotCounter,
    ) -> None:
        self.weight = torch.zeros(out_channels, channels, 3, 3, dtype=dtype, device=device)
        self.bias = torch.zeros(out_channels, dtype=dtype, device=device)
        self.time_conv = (
            CausalConv3d(channels, 2 * channels, (3, 1, 1), dtype, device, slots)
            if temporal
            else None
        )
        self.seen = slots.take() if temporal else None  # marks "the first frame went by"

    def targets(self) -> dict[str, torch.Tensor]:
        out = {"resample.1.weight": self.weight, "resample.1.bias": self.bias}
        if self.time_conv is not None:
            out.update(self.time_conv.targets("time_conv"))
        return out

    def __call__(self, x: torch.Tensor, cache: ChunkCache | None) -> torch.Tensor:
        if self.time_conv is not None:
            x = self._double_frames(x, cache)
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)
        wide = frames.to(wide_dtype(frames.dtype))
        frames = F.interpolate(wide, scale_factor=2.0, mode="nearest-exact").to(x.dtype)
        frames = F.conv2d(frames, self.weight, self.bias, padding=1)
        return frames.view(b, t, *frames.shape[1:]).transpose(1, 2)

    def _double_frames(self, x: torch.Tensor, cache: ChunkCache | None) -> torch.Tensor:
        assert self.time_conv is not None and self.seen is not None
        if cache is None:  # the whole video at once: the first frame alone, the rest doubled
            if x.shape[2] == 1:
                return x
            return torch.cat([x[:, :, :1], self._doubled(x[:, :, 1:], None)], dim=2)
        if cache.read(self.seen) is None:
            cache.write(self.seen, x.new_zeros(x.shape[0], 0))  # an empty marker per row
            if x.shape[2] == 1:
                return x
            return torch.cat([x[:, :, :1], self._doubled(x[:, :, 1:], cache)], dim=2)
        return self._doubled(x, cache)

    def _doubled(self, x: torch.Tensor, cache: ChunkCache | None) -> torch.Tensor:
        assert self.time_conv is not None
        b, c, t, h, w = x.shape
        pairs = self.time_conv(x, cache).view(b, 2, c, t, h, w)
        return pairs.permute(0, 2, 3, 1, 4, 5).reshape(b, c, 2 * t, h, w)


def duplicate_up(
    x: torch.Tensor, out_channels: int, frames: int, first_chunk: bool
) -> torch.Tensor:
    """The Wan 2.2 up blocks' parameter-free shortcut: repeat channels, then fold them into
    `frames` x 2 x 2 new positions; a video's first chunk keeps only its last new frame."""
    b, c, t, h, w = x.shape
    repeats = out_channels * frames * 4 // c
    x = x.repeat_interleave(repeats, dim=1).view(b, out_channels, frames, 2, 2, t, h, w)
    x = x.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, out_channels, t * frames, h * 2, w * 2)
    return x[:, :, frames - 1 :] if first_chunk else x


def unpatchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """[b, c * p * p, t, h, w] -> [b, c, t, h * p, w * p]; channel = (c, column, row offset)."""
    if patch == 1:
        return x
    b, cpp, t, h, w = x.shape
    x = x.view(b, cpp // (patch * patch), patch, patch, t, h, w)
    x = x.permute(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, cpp // (patch * patch), t, h * patch, w * patch)
