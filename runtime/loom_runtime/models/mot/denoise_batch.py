"""DenoiseBatch: one denoise step of several requests, each its noisy latents, its flow time and
where its text KV lies in the paged cache (written by its AR decoding, read here, never rewritten).

A plain frozen record, its checks and the rows it lays out; never runs a forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loom_runtime.models.mot.config import MotConfig
from loom_runtime.models.mot.image_heads import patchify


@dataclass(frozen=True)
class DenoiseRequest:
    """One request's step: latents x_t at flow time t (1 = noise, 0 = image) and its text KV."""

    latents: torch.Tensor  # [C, H, W], H and W multiples of the patch size
    timestep: float  # flow time t in [0, 1]
    context_len: int  # text tokens of the request in the cache (0: unconditional)
    block_table: list[int]  # its KV blocks, as the AR loop's table holds them


@dataclass(frozen=True)
class DenoiseLayout:
    """A batch's latent tokens flattened in request order: request i owns rows
    spans[i][0]:spans[i][1]; its text KV is texts[i] (blocks, length)."""

    patches: torch.Tensor  # [n, C·p²]
    times: torch.Tensor  # [n] the flow time of each row's request
    positions: torch.Tensor  # [n] int64: context_len, context_len + 1, ... per request
    spans: tuple[tuple[int, int], ...]
    texts: tuple[tuple[torch.Tensor, int], ...]


@dataclass(frozen=True)
class DenoiseBatch:
    requests: tuple[DenoiseRequest, ...]

    def layout(self, patch: int, dtype: torch.dtype, device: torch.device) -> DenoiseLayout:
        """The rows one forward runs, on `device`; latent tokens sit after their text, in
        raster order."""
        counts = self.token_counts(patch)
        ends = torch.tensor(counts).cumsum(0).tolist()
        spans = tuple((end - n, end) for n, end in zip(counts, ends, strict=True))
        pairs = list(zip(self.requests, counts, strict=True))
        patches = torch.cat([patchify(r.latents.to(dtype), patch) for r in self.requests])
        times = torch.cat([torch.full((n,), r.timestep, dtype=dtype) for r, n in pairs])
        positions = torch.cat([torch.arange(r.context_len, r.context_len + n) for r, n in pairs])
        texts = tuple(
            (torch.as_tensor(r.block_table, dtype=torch.long, device=device), r.context_len)
            for r in self.requests
        )
        return DenoiseLayout(
            patches.to(device), times.to(device), positions.to(device), spans, texts
        )

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
