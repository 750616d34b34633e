"""The flow-matching Euler sampler equals diffusers' FlowMatchEulerDiscreteScheduler exactly:
the same sigmas and timesteps for every step count and shift, and the same latents step by step."""

from __future__ import annotations

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from loom_runtime.diffusion.flow_match import euler_step, flow_schedule, shifted
from loom_runtime.errors import InvalidRequestError

CASES = [(1, 1.0), (4, 3.0), (20, 12.0), (50, 5.0)]


@pytest.mark.parametrize(("steps", "shift"), CASES)
def test_schedule_is_the_references_to_the_last_bit(steps: int, shift: float) -> None:
    ref = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    ref.set_timesteps(steps)
    ours = flow_schedule(steps, shift)
    assert ours.num_steps == steps
    assert torch.equal(torch.tensor(ours.sigmas, dtype=torch.float32), ref.sigmas)
    assert torch.equal(torch.tensor(ours.timesteps, dtype=torch.float32), ref.timesteps)
    assert ours.sigmas[0] == 1.0 and ours.sigmas[-1] == 0.0


@pytest.mark.parametrize(("steps", "shift"), CASES)
def test_euler_steps_give_the_references_latents(steps: int, shift: float) -> None:
    ref = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    ref.set_timesteps(steps)
    schedule = flow_schedule(steps, shift)
    gen = torch.Generator().manual_seed(steps)
    theirs = torch.randn(1, 4, 2, 8, 8, generator=gen)
    ours = theirs.clone()
    for i, t in enumerate(ref.timesteps):
        velocity = torch.randn(theirs.shape, generator=gen)
        theirs = ref.step(velocity, t, theirs).prev_sample
        ours = euler_step(ours, velocity, schedule.sigmas[i], schedule.sigmas[i + 1])
    assert torch.equal(ours, theirs)


def test_shift_one_is_the_identity_and_larger_shifts_stay_noisier() -> None:
    assert shifted(0.25, 1.0) == 0.25
    assert shifted(0.25, 5.0) > shifted(0.25, 3.0) > 0.25


@pytest.mark.parametrize(("steps", "shift"), [(0, 1.0), (-3, 1.0), (4, 0.0), (4, -1.0)])
def test_bad_step_counts_and_shifts_are_refused(steps: int, shift: float) -> None:
    with pytest.raises(InvalidRequestError):
        flow_schedule(steps, shift)
