"""WanDiT == diffusers' WanTransformer3DModel on the tiny checkpoint (C0): a multi-frame video
latent and a single-frame image latent, a batch with different timesteps, bad latent shapes,
and bfloat16 bit for bit.

Tolerance (float64): the reference rounds its norms, modulation and residual sums through
float32 (`.float()` in its forward) even with float64 parameters, so agreement is at float32
level; we allow 1e-5 relative to the output's scale (measured: 3.6e-7 absolute at scale 3.7,
i.e. 1e-7 relative). In float32 and bfloat16 the two are bit-identical on the CPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from loom_runtime.errors import InvalidRequestError
from loom_runtime.models.wan.loader import LoadedWan

TOLERANCE = 1e-5
TEXT_TOKENS = 7


def seeded(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def run_both(ours: LoadedWan, reference: Any, latents: torch.Tensor, timestep: torch.Tensor):
    text = seeded(latents.shape[0], TEXT_TOKENS, ours.config.transformer.text_dim, seed=1)
    got = ours.transformer.forward(latents, timestep, text)
    with torch.no_grad():
        expected = reference(latents, timestep, text, return_dict=False)[0]
    return got, expected


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape and got.dtype == torch.float64
    scale = expected.abs().max().item()
    assert scale > 0.1  # a real signal, not all zeros
    error = (got - expected).abs().max().item()
    assert error <= TOLERANCE * scale, f"max |ours - diffusers| = {error:.3g} (scale {scale:.3g})"


def test_video_latents_equal_diffusers(ours: LoadedWan, reference_dit: Any) -> None:
    latents = seeded(1, 4, 3, 4, 6)  # 3 latent frames of 4 x 6: a 3 x 2 x 3 token grid
    got, expected = run_both(ours, reference_dit, latents, torch.tensor([731.0]))
    assert_close(got, expected)


def test_single_frame_image_latent_equals_diffusers(ours: LoadedWan, reference_dit: Any) -> None:
    latents = seeded(1, 4, 1, 6, 4, seed=2)
    got, expected = run_both(ours, reference_dit, latents, torch.tensor([250.5]))
    assert_close(got, expected)


def test_batch_with_different_timesteps_equals_diffusers(
    ours: LoadedWan, reference_dit: Any
) -> None:
    latents = seeded(2, 4, 2, 4, 4, seed=3)
    got, expected = run_both(ours, reference_dit, latents, torch.tensor([999.0, 3.0]))
    assert_close(got, expected)
    assert not torch.allclose(got[0], got[1])  # the timestep reaches the output


def test_frames_and_positions_matter(ours: LoadedWan) -> None:
    """Swapping two latent frames changes the other frames' output (attention across frames
    with rotary positions), so the video path is not a stack of images."""
    latents = seeded(1, 4, 3, 4, 4, seed=4)
    text = seeded(1, TEXT_TOKENS, 32, seed=5)
    t = torch.tensor([500.0])
    base = ours.transformer.forward(latents, t, text)
    swapped = ours.transformer.forward(latents[:, :, [1, 0, 2]], t, text)
    assert not torch.allclose(base[:, :, 2], swapped[:, :, 2])


def test_bfloat16_is_bit_identical_to_diffusers_bfloat16(
    ours_bf16: LoadedWan, reference_dit_bf16: Any
) -> None:
    """Half precision follows the reference's precision policy op for op: time MLP,
    modulation tables, norms and gated residual sums in float32, the rest in bfloat16."""
    latents = seeded(1, 4, 3, 4, 6, seed=6).to(torch.bfloat16)
    text = seeded(1, TEXT_TOKENS, 32, seed=7).to(torch.bfloat16)
    t = torch.tensor([640.0])
    got = ours_bf16.transformer.forward(latents, t, text)
    with torch.no_grad():
        expected = reference_dit_bf16(latents, t, text, return_dict=False)[0]
    assert got.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(got, expected)


@pytest.mark.parametrize("shape", [(1, 4, 2, 5, 4), (1, 3, 1, 4, 4), (4, 4, 4)])
def test_latents_that_do_not_fit_are_a_request_error(
    ours: LoadedWan, shape: tuple[int, ...]
) -> None:
    with pytest.raises(InvalidRequestError, match="latent"):
        ours.transformer.forward(torch.zeros(shape), torch.tensor([1.0]), torch.zeros(1, 2, 32))
