"""A think-then-draw request's image half at the engine's door: the checks that must fail with
a 400 (no denoise loop here, a size that is no whole patch grid, a step over the step budget)
and the seeded noise its denoise loop starts from.

Pure checks and one seeded draw; never queues, schedules or touches KV blocks.
"""

from __future__ import annotations

import torch

from loom_runtime.engine.types import DrawSpec, EngineRequest
from loom_runtime.errors import InvalidRequestError

MAX_DRAW_STEPS = 1000
"""Denoise steps one request may ask for."""


def latent_tokens(spec: DrawSpec, patch: int) -> int:
    """Tokens one denoise step of this image pushes through the model: (H/p)·(W/p)."""
    return (spec.height // patch) * (spec.width // patch)


def check_draw(req: EngineRequest, patch: int | None, token_budget: int) -> None:
    """InvalidRequestError when the engine cannot draw what `req.draw` asks (`patch`: the
    model's patch size, None when it has no denoise loop)."""
    spec, rid = req.draw, req.request_id
    if spec is None:
        return
    if patch is None:
        raise InvalidRequestError(
            f"request {rid!r}: this engine has no denoise loop (a MoT model served aggregated "
            "in one process has one); it cannot draw",
            param="draw",
        )
    for name, value in (("height", spec.height), ("width", spec.width)):
        if value < patch or value % patch:
            raise InvalidRequestError(
                f"request {rid!r}: latent {name} {value} must be a positive multiple of the "
                f"patch size {patch}",
                param=name,
            )
    if not 1 <= spec.num_steps <= MAX_DRAW_STEPS:
        raise InvalidRequestError(
            f"request {rid!r}: num_steps {spec.num_steps} must be in 1..{MAX_DRAW_STEPS}",
            param="num_steps",
        )
    tokens = latent_tokens(spec, patch)
    if tokens > token_budget:
        raise InvalidRequestError(
            f"request {rid!r}: a {spec.height}x{spec.width} latent is {tokens} tokens per "
            f"denoise step, over the step budget of {token_budget} (max_num_batched_tokens); "
            "ask for a smaller image",
            param="size",
        )


def draw_noise(
    spec: DrawSpec, channels: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The latents at t = 1: N(0, 1) [channels, height, width] from the request's seed (drawn
    on the CPU in float64, so every device and dtype starts from the same numbers)."""
    gen = torch.Generator().manual_seed(spec.seed)
    noise = torch.randn(channels, spec.height, spec.width, generator=gen, dtype=torch.float64)
    return noise.to(dtype=dtype, device=device)
