"""The MoT denoise loop: a request's image latents, from noise (t = 1) to a sample (t = 0), in
N flow-matching Euler steps, each one DENOISE_STEP plan that attends to the request's text KV
where its text loop left it in the paged cache; and the executor that runs a step's plans.

Owns a request's denoise state and the Euler arithmetic; never allocates, frees or writes KV
blocks (the text loop owns them) and never decides what shares a step (the scheduler does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.loop.contract import Done, LoopContext, ResourceRequest, WorkPlan
from loom_runtime.models.mot.denoise_batch import DenoiseBatch, DenoiseRequest
from loom_runtime.models.mot.model import MotForCausalLM

DENOISE_STEP = "mot_denoise_step"
"""The plans' shape: every MoT denoise step of a scheduler step runs in one executor call."""


@dataclass(frozen=True)
class DenoiseStart:
    """What a denoise loop starts from: the noise, its step count and the request's text KV
    (its AR loop's block table and length, read by every step, never written)."""

    request_id: str
    noise: torch.Tensor  # [C, H, W]: the latents at t = 1
    num_steps: int
    context_len: int
    block_table: tuple[int, ...]


@dataclass
class DenoiseState:
    """One request's progress: its latents at the current flow time and the step it is at."""

    start: DenoiseStart
    latents: torch.Tensor = field(repr=False)
    step: int = 0
    weights_version: str = ""

    @property
    def request_id(self) -> str:
        return self.start.request_id

    def time(self, step: int) -> float:
        """Flow time before `step`: 1 (noise) down to 0 (the sample), evenly spaced."""
        return 1.0 - step / self.start.num_steps


class MotDenoiseLoop:
    """`diffusion` loops of a mot card; its plans run on a MotDenoiseExecutor."""

    kind = "diffusion"

    def __init__(self, patch_size: int) -> None:
        self.patch_size = patch_size

    def init(self, start: DenoiseStart, ctx: LoopContext) -> DenoiseState:
        if start.num_steps < 1:
            raise ValueError(f"request {start.request_id!r}: num_steps must be >= 1")
        return DenoiseState(start, start.noise.clone(), weights_version=ctx.weights_version)

    def next(self, state: DenoiseState) -> WorkPlan[torch.Tensor] | Done:
        """The next Euler step's velocity, or Done after the last step."""
        if state.step == state.start.num_steps:
            return Done("denoised")
        start = state.start
        work = DenoiseRequest(
            state.latents, state.time(state.step), start.context_len, list(start.block_table)
        )
        _, height, width = state.latents.shape
        tokens = (height // self.patch_size) * (width // self.patch_size)
        return WorkPlan(
            kind="denoise_step",
            shape=DENOISE_STEP,
            resources=ResourceRequest(compute_tokens=tokens),
            work=work,
            request_id=start.request_id,
        )

    def advance(self, state: DenoiseState, velocity: torch.Tensor) -> DenoiseState:
        """x(t_next) = x(t) + (t_next - t) · v: one Euler step toward t = 0."""
        t, t_next = state.time(state.step), state.time(state.step + 1)
        state.latents = state.latents + (t_next - t) * velocity.to(state.latents.dtype)
        state.step += 1
        return state

    def rebase(
        self, state: DenoiseState, version: str, block_table: tuple[int, ...] | None = None
    ) -> None:
        """New weights under a running loop (a keep swap): its next steps run on `version`,
        attending to its text KV in `block_table` when that was recomputed into new blocks."""
        state.weights_version = version
        if block_table is not None:
            state.start = replace(state.start, block_table=block_table)

    def finalize(self, state: DenoiseState) -> torch.Tensor:
        """The denoised latents [C, H, W] (a VAE decodes them to pixels)."""
        return state.latents


class MotDenoiseExecutor:
    """Runs a step's DENOISE_STEP plans as one `denoise` call of the model over the cache its
    text loop writes."""

    def __init__(self, model: MotForCausalLM, kv: PagedKVCache) -> None:
        self.model = model
        self.kv = kv

    def execute(self, plans: Sequence[WorkPlan[torch.Tensor]]) -> list[torch.Tensor]:
        requests = []
        for plan in plans:
            if not isinstance(plan.work, DenoiseRequest):
                raise TypeError(f"plan {plan.kind!r} of {plan.request_id!r} is no denoise step")
            requests.append(plan.work)
        return self.model.denoise(DenoiseBatch(tuple(requests)), self.kv)
