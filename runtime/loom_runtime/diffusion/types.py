"""The records of a diffusion request: what is asked, each phase's plan payload and result, and
what comes out. Frozen at every seam; the tensors they carry are never written through them.

Owns no behaviour; never imports a model (the loop and the executors do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from loom_runtime.models.wan.vae_cache import CausalCache

TEXT_ENCODE = "text_encode"
DENOISE = "denoise"
VAE_DECODE = "vae_decode"

Phase = Literal["encode", "denoise", "decode", "done"]


@dataclass(frozen=True)
class DiffusionRequest:
    """One image (num_frames 1) or video: the prompt's token ids (and the negative prompt's,
    read when guidance_scale > 1, as in classifier-free guidance), size, steps and seed."""

    request_id: str
    prompt_ids: tuple[int, ...]
    height: int
    width: int
    num_frames: int = 1
    num_steps: int | None = None  # None: the loop's default (the card's steps)
    guidance_scale: float = 1.0
    negative_ids: tuple[int, ...] = ()
    seed: int = 0

    @property
    def guided(self) -> bool:
        return self.guidance_scale > 1.0


@dataclass(frozen=True)
class EncodeWork:
    """Token rows to encode for one request: the prompt, then the negative prompt if guided."""

    rows: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class DenoiseWork:
    """One Euler step's model input: latents [1, C, F, H, W], the step's timestep, the text
    features [L, D] (and the negative ones under guidance) and the guidance scale."""

    latents: torch.Tensor = field(repr=False)
    timestep: float
    text: torch.Tensor = field(repr=False)
    negative: torch.Tensor | None = field(repr=False)
    guidance_scale: float


@dataclass(frozen=True)
class DecodeWork:
    """The next latent frame [1, z, 1, H, W] of one video and its decode's causal cache."""

    latents: torch.Tensor = field(repr=False)
    cache: CausalCache = field(repr=False)


@dataclass(frozen=True)
class DiffusionResult:
    """What one executed plan produced: text features (one per encoded row), the guided
    velocity of a denoise step, or a decoded chunk of pixels [1, 3, frames, H, W]."""

    features: tuple[torch.Tensor, ...] = ()
    velocity: torch.Tensor | None = None
    pixels: torch.Tensor | None = None


@dataclass(frozen=True)
class DiffusionOutput:
    """A finished request: frames [num_frames, H, W, 3] in 0..1 (empty when aborted)."""

    request_id: str
    frames: torch.Tensor = field(repr=False)
    finish_reason: Literal["done", "abort"]
    num_steps: int
