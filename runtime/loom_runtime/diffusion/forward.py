"""The executors of diffusion plans: text encode, denoise (one batched DiT forward for every
compatible step of the step, classifier-free guidance batched in it) and VAE decode chunks (one
batched decoder call for the step's same-shaped chunks, their causal caches stacked).

Owns turning a step's plans into DiffusionResults and timing each forward (handed to `observe`,
for the step cost model); never advances a loop or picks plans.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar, cast

import torch

from loom_runtime.diffusion.loop import DiffusionShape
from loom_runtime.diffusion.step_cost import StepSample
from loom_runtime.diffusion.types import (
    DENOISE,
    TEXT_ENCODE,
    VAE_DECODE,
    DecodeWork,
    DenoiseWork,
    DiffusionResult,
    EncodeWork,
)
from loom_runtime.loop.contract import Executor, WorkPlan
from loom_runtime.models.wan.dit import WanDiT
from loom_runtime.models.wan.loader import LoadedWan
from loom_runtime.models.wan.text_encoder import Umt5Encoder
from loom_runtime.models.wan.vae import WanVaeDecoder
from loom_runtime.models.wan.vae_cache import BatchedCausalCache, ChunkCache

W = TypeVar("W")
Observe = Callable[[StepSample], None]


def _unobserved(sample: StepSample) -> None:
    """The default `observe`: measured forwards go nowhere."""


def _elapsed(start: float, out: torch.Tensor | None) -> float:
    """Seconds since `start` once `out` is computed (a CUDA forward is waited for)."""
    if out is not None and out.is_cuda:
        torch.cuda.synchronize(out.device)
    return time.perf_counter() - start


def _works(plans: Sequence[WorkPlan[DiffusionResult]], kind: type[W]) -> list[W]:
    works = [p.work for p in plans]
    for plan, work in zip(plans, works, strict=True):
        if not isinstance(work, kind):
            raise TypeError(
                f"plan {plan.kind!r} of request {plan.request_id!r} carries a "
                f"{type(work).__name__}, not a {kind.__name__}"
            )
    return cast(list[W], works)


class TextEncode:
    """Every prompt row of the step in one encoder forward, padded to `text_len`; features past
    a row's own tokens are zeroed, as Wan pipelines do, so padding never conditions the DiT."""

    def __init__(
        self,
        encoder: Umt5Encoder,
        text_len: int,
        dtype: torch.dtype,
        observe: Observe = _unobserved,
    ) -> None:
        self.encoder, self.text_len, self.dtype = encoder, text_len, dtype
        self.observe = observe

    def execute(self, plans: Sequence[WorkPlan[DiffusionResult]]) -> list[DiffusionResult]:
        works = _works(plans, EncodeWork)
        rows = [row for w in works for row in w.rows]
        ids = torch.zeros(len(rows), self.text_len, dtype=torch.long)
        mask = torch.zeros(len(rows), self.text_len, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        start = time.perf_counter()
        hidden = self.encoder.forward(ids, mask).to(self.dtype)
        seconds = _elapsed(start, hidden)
        self.observe(StepSample(TEXT_ENCODE, (self.text_len,), len(rows), seconds))
        hidden = hidden * mask[:, :, None].to(hidden)
        out, at = [], 0
        for w in works:
            out.append(DiffusionResult(features=tuple(hidden[at + j] for j in range(len(w.rows)))))
            at += len(w.rows)
        return out


class DenoiseForward:
    """One DiT forward per latent size for a step's denoise plans: each request's latents
    once per text (its prompt, and under guidance its negative prompt), so guidance costs a
    wider batch, not a second pass. Velocity = uncond + scale · (cond − uncond)."""

    def __init__(self, dit: WanDiT, observe: Observe = _unobserved) -> None:
        self.dit, self.observe = dit, observe

    def execute(self, plans: Sequence[WorkPlan[DiffusionResult]]) -> list[DiffusionResult]:
        works = _works(plans, DenoiseWork)
        by_size: dict[tuple[int, ...], list[int]] = {}
        for i, w in enumerate(works):
            by_size.setdefault(tuple(w.latents.shape), []).append(i)
        out: dict[int, DiffusionResult] = {}
        for size, indices in by_size.items():
            start = time.perf_counter()
            velocities = self._forward([works[i] for i in indices])
            seconds = _elapsed(start, velocities[-1].velocity)
            rows = len(indices) + sum(works[i].negative is not None for i in indices)
            self.observe(StepSample(DENOISE, size, rows, seconds))
            out.update(zip(indices, velocities, strict=True))
        return [out[i] for i in range(len(works))]

    def _forward(self, works: list[DenoiseWork]) -> list[DiffusionResult]:
        """One forward over same-size latents: every prompt row, then every negative row."""
        guided = [w for w in works if w.negative is not None]
        latents = [w.latents for w in works] + [w.latents for w in guided]
        texts = [w.text for w in works] + [w.negative for w in guided if w.negative is not None]
        steps = [w.timestep for w in works] + [w.timestep for w in guided]
        x = torch.cat(latents).to(self.dit.dtype)
        t = torch.tensor(steps, dtype=torch.float32)
        v = self.dit.forward(x, t, torch.stack(texts))
        out, uncond_row = [], len(works)
        for i, w in enumerate(works):
            velocity = v[i : i + 1]
            if w.negative is not None:
                uncond = v[uncond_row : uncond_row + 1]
                velocity = uncond + w.guidance_scale * (velocity - uncond)
                uncond_row += 1
            out.append(DiffusionResult(velocity=velocity))
        return out


class VaeDecode:
    """The next latent frame of each video through the VAE decoder, each with its own causal
    cache (so the frames of one video decode in order, one plan each, interleaved with other
    work). The step's plans of one latent shape and first-chunk status decode in one batched
    call, their caches stacked into a BatchedCausalCache; each video gets its own pixels."""

    def __init__(self, vae: WanVaeDecoder, observe: Observe = _unobserved) -> None:
        self.vae, self.observe = vae, observe

    def execute(self, plans: Sequence[WorkPlan[DiffusionResult]]) -> list[DiffusionResult]:
        works = _works(plans, DecodeWork)
        out: dict[int, DiffusionResult] = {}
        for indices in decode_groups(works):
            group = [works[i] for i in indices]
            start = time.perf_counter()
            pixels = self._decode(group)
            seconds = _elapsed(start, pixels)
            size = tuple(group[0].latents.shape)
            self.observe(StepSample(VAE_DECODE, size, len(group), seconds))
            if len(group) == 1:
                out[indices[0]] = DiffusionResult(pixels=pixels)
                continue
            for row, i in enumerate(indices):  # a copy each: no video holds the batch's pixels
                out[i] = DiffusionResult(pixels=pixels[row : row + 1].clone())
        return [out[i] for i in range(len(works))]

    def _decode(self, group: list[DecodeWork]) -> torch.Tensor:
        """One decode_chunk call over the group's latents, one batch row per video."""
        latents = torch.cat([w.latents for w in group]).to(self.vae.dtype)
        cache: ChunkCache = (
            group[0].cache if len(group) == 1 else BatchedCausalCache([w.cache for w in group])
        )
        return self.vae.decode_chunk(self.vae.unscale_latents(latents), cache)


def decode_groups(works: Sequence[DecodeWork]) -> list[list[int]]:
    """The indices of `works` that can share one decode call, in first-seen order: the same
    latent shape and the same first-chunk status (the decoder branches on it)."""
    groups: dict[tuple[tuple[int, ...], bool], list[int]] = {}
    for i, w in enumerate(works):
        if w.latents.shape[0] != 1:
            shape = tuple(w.latents.shape)
            raise ValueError(f"a decode plan's latents must be one batch row, got shape {shape}")
        groups.setdefault((tuple(w.latents.shape), w.cache.first_chunk), []).append(i)
    return list(groups.values())


def wan_shape(loaded: LoadedWan, text_len: int) -> DiffusionShape:
    """The latent geometry, text length and flow shift a Wan checkpoint fixes."""
    c = loaded.config
    return DiffusionShape(
        latent_channels=c.transformer.in_channels,
        spatial_scale=c.vae.scale_factor_spatial,
        temporal_scale=c.vae.scale_factor_temporal,
        patch=c.transformer.patch_size,
        text_len=text_len,
        shift=c.scheduler.flow_shift,
        vae_cache_slots=loaded.vae.cache_slots,
        num_train_timesteps=c.scheduler.num_train_timesteps,
    )


def wan_executors(
    loaded: LoadedWan, text_len: int, observe: Observe = _unobserved
) -> dict[Hashable, Executor[DiffusionResult]]:
    """One executor per plan shape of a Wan checkpoint's diffusion loop (any latent size); each
    forward's measured time goes to `observe`."""
    encode = TextEncode(loaded.text_encoder, text_len, loaded.transformer.dtype, observe)
    return {
        TEXT_ENCODE: encode,
        DENOISE: DenoiseForward(loaded.transformer, observe),
        VAE_DECODE: VaeDecode(loaded.vae, observe),
    }
