"""The flow-matching Euler sampler: a request's sigma schedule (with the flow shift) and one step.

Pure arithmetic on plain values and tensors; never runs a model and never holds a request's state.
Matches diffusers' FlowMatchEulerDiscreteScheduler (fixed shift), including its double shift of
the smallest sigma, so a seeded generation reproduces the reference pipeline's latents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from loom_runtime.errors import InvalidRequestError

Sigma = TypeVar("Sigma", float, np.ndarray, torch.Tensor)


@dataclass(frozen=True)
class FlowSchedule:
    """`sigmas` has num_steps + 1 entries (the last is 0: the clean sample); `timesteps` the
    model's conditioning value at each of the num_steps steps (sigma × num_train_timesteps)."""

    sigmas: tuple[float, ...]
    timesteps: tuple[float, ...]

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)


def shifted(sigma: Sigma, shift: float) -> Sigma:
    """The flow shift: sigma' = shift·σ / (1 + (shift − 1)·σ); shift 1 leaves σ as it is."""
    return shift * sigma / (1 + (shift - 1) * sigma)


def flow_schedule(num_steps: int, shift: float, num_train_timesteps: int = 1000) -> FlowSchedule:
    """The schedule of `num_steps` Euler steps from pure noise (σ = 1) to the clean sample."""
    if num_steps < 1:
        raise InvalidRequestError(f"num_inference_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise InvalidRequestError(f"the flow shift must be positive, got {shift}")
    n = num_train_timesteps
    # The reference's training table is float32 and already shifted; its ends bound the linspace.
    train = torch.from_numpy(np.linspace(1, n, n, dtype=np.float32)[::-1].copy()) / n
    train = shifted(train, shift)
    sigma_max, sigma_min = float(train[0]), float(train[-1])
    timesteps = np.linspace(sigma_max * n, sigma_min * n, num_steps)
    sigmas = torch.from_numpy(shifted(timesteps / n, shift)).to(torch.float32)
    steps = sigmas * n
    return FlowSchedule(
        sigmas=(*(float(s) for s in sigmas), 0.0), timesteps=tuple(float(t) for t in steps)
    )


def euler_step(
    sample: torch.Tensor, velocity: torch.Tensor, sigma: float, sigma_next: float
) -> torch.Tensor:
    """x at sigma_next from x at sigma and the predicted velocity, computed in float32 and
    returned in the velocity's dtype (as the reference does)."""
    prev = sample.to(torch.float32) + (sigma_next - sigma) * velocity.to(torch.float32)
    return prev.to(velocity.dtype)
