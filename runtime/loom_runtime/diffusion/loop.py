"""The diffusion loop: text encode -> N flow-matching Euler denoise steps -> VAE decode, one
WorkPlan per step (each latent frame's decode is its own plan), on the one loop contract.

Owns a request's state machine and its seeded latents; never runs a model (the executors of
diffusion/forward.py do) and never decides what shares a step (the scheduler does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loom_runtime.diffusion.flow_match import FlowSchedule, euler_step, flow_schedule
from loom_runtime.diffusion.text_feature_cache import TextFeatureCache
from loom_runtime.diffusion.types import (
    DENOISE,
    TEXT_ENCODE,
    VAE_DECODE,
    DecodeWork,
    DenoiseWork,
    DiffusionOutput,
    DiffusionRequest,
    DiffusionResult,
    EncodeWork,
    Phase,
)
from loom_runtime.errors import InvalidRequestError
from loom_runtime.loop.contract import Done, LoopContext, ResourceRequest, WorkPlan
from loom_runtime.models.wan.vae_cache import CausalCache


@dataclass(frozen=True)
class DiffusionShape:
    """What a request's latents look like, fixed by the checkpoint: channels, the VAE's
    spatial and temporal scale, the DiT's patch, and the text length the encoder pads to."""

    latent_channels: int
    spatial_scale: int
    temporal_scale: int
    patch: tuple[int, int, int]
    text_len: int
    shift: float  # the scheduler's flow shift
    vae_cache_slots: int  # causal-convolution histories one video's decode keeps
    num_train_timesteps: int = 1000


@dataclass
class DiffusionState:
    """One request's progress: its phase, text features, latents and Euler step, and the VAE
    decode's causal cache and decoded chunks. Owned by the loop; one per request."""

    request: DiffusionRequest
    schedule: FlowSchedule
    latents: torch.Tensor = field(repr=False)
    phase: Phase = "encode"
    step: int = 0
    text: torch.Tensor | None = field(default=None, repr=False)
    negative: torch.Tensor | None = field(default=None, repr=False)
    cache: CausalCache | None = field(default=None, repr=False)
    chunks: list[torch.Tensor] = field(default_factory=list, repr=False)
    aborted: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def progress(self) -> tuple[int, int]:
        """(denoise steps done, steps in all)."""
        return self.step, self.schedule.num_steps


class DiffusionLoop:
    """`diffusion` loops of a card. `pinned_steps` is a distilled recipe's step count: any
    other count is refused, since those weights were trained for exactly that many steps.
    With a `features` cache, a request whose prompt rows are all cached starts at its first
    denoise step (no encode plan), and every encode result is stored in it."""

    kind = "diffusion"

    def __init__(
        self,
        shape: DiffusionShape,
        default_steps: int,
        pinned_steps: int | None = None,
        features: TextFeatureCache | None = None,
    ) -> None:
        if pinned_steps is not None and default_steps != pinned_steps:
            raise ValueError(
                f"the loop runs {default_steps} steps but its recipe is distilled for "
                f"{pinned_steps}: set the loop's steps to {pinned_steps}"
            )
        self.shape = shape
        self.default_steps = default_steps
        self.pinned_steps = pinned_steps
        self.features = features

    def latent_shape(self, req: DiffusionRequest) -> tuple[int, int, int, int, int]:
        """[1, channels, latent frames, H, W] of a request; InvalidRequestError (400) for a
        size or frame count the VAE and the DiT's patch cannot divide."""
        s = self.shape
        pt, ph, pw = s.patch
        cell = s.spatial_scale * max(ph, pw)
        if req.height < cell or req.width < cell or req.height % cell or req.width % cell:
            raise InvalidRequestError(
                f"size {req.width}x{req.height}: width and height must be positive multiples "
                f"of {cell} (the VAE's scale {s.spatial_scale} x the patch)"
            )
        if req.num_frames < 1 or (req.num_frames - 1) % s.temporal_scale:
            raise InvalidRequestError(
                f"num_frames {req.num_frames}: must be 1 (an image) or 1 + a multiple of "
                f"{s.temporal_scale}"
            )
        frames = (req.num_frames - 1) // s.temporal_scale + 1
        if frames % pt:
            raise InvalidRequestError(f"{frames} latent frames do not divide the patch {pt}")
        return (1, s.latent_channels, frames, req.height // s.spatial_scale,
                req.width // s.spatial_scale)  # fmt: skip

    def init(self, req: DiffusionRequest, ctx: LoopContext) -> DiffusionState:
        steps = self.default_steps if req.num_steps is None else req.num_steps
        if self.pinned_steps is not None and steps != self.pinned_steps:
            raise InvalidRequestError(
                f"request {req.request_id!r} asks for {steps} steps, but this model is "
                f"distilled for exactly {self.pinned_steps} (its recipe): other step counts "
                "lose quality silently, so they are refused; omit num_inference_steps"
            )
        if len(req.prompt_ids) > self.shape.text_len or len(req.negative_ids) > self.shape.text_len:
            raise InvalidRequestError(
                f"request {req.request_id!r}: prompts are limited to {self.shape.text_len} tokens"
            )
        schedule = flow_schedule(steps, self.shape.shift, self.shape.num_train_timesteps)
        generator = torch.Generator().manual_seed(req.seed)
        latents = torch.randn(self.latent_shape(req), generator=generator, dtype=torch.float32)
        state = DiffusionState(request=req, schedule=schedule, latents=latents)
        cached = None if self.features is None else self.features.lookup(_rows(req))
        if cached is not None:
            state.text, state.negative = cached[0], cached[1] if req.guided else None
            state.phase = "denoise"
        return state

    def next(self, state: DiffusionState) -> WorkPlan[DiffusionResult] | Done:
        req = state.request
        if state.aborted or state.phase == "done":
            return Done("abort" if state.aborted else "done")
        if state.phase == "encode":
            return self._plan(TEXT_ENCODE, TEXT_ENCODE, EncodeWork(_rows(req)), req)
        if state.phase == "denoise":
            assert state.text is not None
            work = DenoiseWork(
                latents=state.latents,
                timestep=state.schedule.timesteps[state.step],
                text=state.text,
                negative=state.negative,
                guidance_scale=req.guidance_scale,
            )
            return self._plan("diffusion_step", DENOISE, work, req)
        assert state.cache is not None
        frame = len(state.chunks)
        chunk = state.latents[:, :, frame : frame + 1]
        return self._plan("vae_tile", VAE_DECODE, DecodeWork(chunk, state.cache), req)

    def advance(self, state: DiffusionState, result: DiffusionResult) -> DiffusionState:
        if state.phase == "encode":
            if self.features is not None:
                self.features.store(_rows(state.request), result.features)
            state.text = result.features[0]
            state.negative = result.features[1] if state.request.guided else None
            state.phase = "denoise"
        elif state.phase == "denoise":
            assert result.velocity is not None
            sigmas = state.schedule.sigmas
            state.latents = euler_step(
                state.latents, result.velocity, sigmas[state.step], sigmas[state.step + 1]
            )
            state.step += 1
            if state.step == state.schedule.num_steps:
                state.phase, state.text, state.negative = "decode", None, None
                state.cache = CausalCache(self.shape.vae_cache_slots)
        else:
            assert result.pixels is not None
            state.chunks.append(result.pixels)
            if len(state.chunks) == state.latents.shape[2]:
                state.phase = "done"
        return state

    def abort(self, state: DiffusionState) -> None:
        """Stop at the next step boundary; finalize frees what the state holds."""
        state.aborted = True

    def finalize(self, state: DiffusionState) -> DiffusionOutput:
        done = state.phase == "done" and not state.aborted
        frames = torch.empty(0)
        if done:
            video = torch.cat(state.chunks, dim=2)[0]  # [3, frames, H, W] in [-1, 1]
            frames = (video / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).float()
        if state.cache is not None:
            state.cache.clear()
        state.chunks.clear()
        state.text = state.negative = None
        return DiffusionOutput(
            request_id=state.request_id,
            frames=frames,
            finish_reason="done" if done else "abort",
            num_steps=state.step,
        )

    @staticmethod
    def _plan(
        kind: str, shape: str, work: object, req: DiffusionRequest
    ) -> WorkPlan[DiffusionResult]:
        return WorkPlan(
            kind=kind, shape=shape, resources=ResourceRequest(), work=work,
            request_id=req.request_id,
        )  # fmt: skip


def _rows(req: DiffusionRequest) -> tuple[tuple[int, ...], ...]:
    """The token rows a request encodes: its prompt, then its negative prompt if guided."""
    return (req.prompt_ids, req.negative_ids) if req.guided else (req.prompt_ids,)
