"""WanVaeDecoder == diffusers' AutoencoderKLWan.decode on the tiny checkpoint (C0): a video of
several latent frames (temporal upsampling, the chunked causal cache) and a one-frame image;
chunked decoding equals whole-video decoding; latent un-scaling equals the Wan pipeline's;
and the Wan 2.2 layout (residual up blocks, 2x2 pixel patches) on its own tiny folder.

Tolerance (float64): diffusers upsamples through float32 (`x.float()`) even in a float64
model, so the two agree at float32 level; we allow 1e-5 absolute (pixels lie in [-1, 1];
measured: 1.6e-7). In bfloat16 the two are bit-identical on the CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from loom_runtime.models.wan.config import WanVaeConfig
from loom_runtime.models.wan.loader import LoadedWan, load_vae
from loom_runtime.models.wan.tiny import DIFFUSERS_WEIGHTS, random_tensors, vae_config
from loom_runtime.models.wan.vae import WanVaeDecoder
from loom_runtime.models.wan.vae_layout import encoder_shapes

TOLERANCE = 1e-5


def seeded(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape
    inside = (expected.abs() < 0.99).double().mean().item()
    assert inside > 0.5  # most pixels are not clamped, so the comparison sees the decoder
    error = (got - expected).abs().max().item()
    assert error <= TOLERANCE, f"max |ours - diffusers| = {error:.3g}"


def test_video_decode_equals_diffusers(ours: LoadedWan, reference_vae: Any) -> None:
    latents = seeded(1, 4, 3, 4, 6)
    got = ours.vae.decode(latents)
    with torch.no_grad():
        expected = reference_vae.decode(latents, return_dict=False)[0]
    assert got.shape == (1, 3, ours.vae.output_frames(3), 32, 48) == (1, 3, 9, 32, 48)
    assert_close(got, expected)


def test_single_frame_image_decode_equals_diffusers(ours: LoadedWan, reference_vae: Any) -> None:
    latents = seeded(2, 4, 1, 4, 4, seed=1)
    got = ours.vae.decode(latents)
    with torch.no_grad():
        expected = reference_vae.decode(latents, return_dict=False)[0]
    assert got.shape == (2, 3, 1, 32, 32)
    assert_close(got, expected)


def test_bfloat16_is_bit_identical_to_diffusers_bfloat16(
    ours_bf16: LoadedWan, reference_vae_bf16: Any
) -> None:
    latents = seeded(1, 4, 3, 4, 6, seed=5).to(torch.bfloat16)
    got = ours_bf16.vae.decode(latents)
    with torch.no_grad():
        expected = reference_vae_bf16.decode(latents, return_dict=False)[0]
    assert got.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(got, expected)


def test_chunked_decode_equals_whole_video_decode(ours: LoadedWan) -> None:
    latents = seeded(1, 4, 4, 2, 2, seed=2)
    chunked = ours.vae.decode(latents)
    whole = ours.vae.decode_chunk(latents, None)
    assert torch.allclose(chunked, whole, atol=1e-12, rtol=0)
    cache = ours.vae.new_cache()
    first = ours.vae.decode_chunk(latents[:, :, :2], cache)  # two latent frames at once
    rest = ours.vae.decode_chunk(latents[:, :, 2:], cache)
    assert cache.nbytes > 0 and cache.chunks == 2
    assert torch.allclose(torch.cat([first, rest], dim=2), whole, atol=1e-12, rtol=0)


def test_earlier_frames_reach_later_ones_through_the_cache(ours: LoadedWan) -> None:
    latents = seeded(1, 4, 3, 2, 2, seed=3)
    changed = latents.clone()
    changed[:, :, 0] += 1.0
    a, b = ours.vae.decode(latents), ours.vae.decode(changed)
    assert not torch.allclose(a[:, :, -1], b[:, :, -1])  # causal: the past reaches the last frame
    later = latents.clone()
    later[:, :, 2] += 1.0
    c = ours.vae.decode(later)
    assert torch.equal(a[:, :, :5], c[:, :, :5])  # and the future never reaches the past


def test_unscale_latents_equals_the_wan_pipeline(ours: LoadedWan) -> None:
    config = ours.config.vae
    latents = seeded(1, 4, 2, 2, 2, seed=4)
    mean = torch.tensor(config.latents_mean, dtype=torch.float64).view(1, 4, 1, 1, 1)
    inverse_std = 1.0 / torch.tensor(config.latents_std, dtype=torch.float64).view(1, 4, 1, 1, 1)
    expected = latents / inverse_std + mean  # diffusers WanPipeline, before vae.decode
    assert torch.allclose(ours.vae.unscale_latents(latents), expected, atol=1e-12)


@pytest.fixture(scope="module")
def wan22_vae(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Wan 2.2-layout VAE folder: residual up blocks, 2x2 pixel patches, its own
    decoder width; random weights through the same writer as init_tiny_wan."""
    raw = {
        **vae_config(),
        "base_dim": 8,
        "decoder_base_dim": 12,
        "in_channels": 12,
        "out_channels": 12,
        "is_residual": True,
        "patch_size": 2,
        "scale_factor_spatial": 16,
    }
    config = WanVaeConfig.from_dict(raw)
    shapes = {n: tuple(t.shape) for n, t in WanVaeDecoder(config).targets().items()}
    shapes.update(encoder_shapes(config))
    folder = tmp_path_factory.mktemp("wan22") / "vae"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    save_file(random_tensors(shapes, seed=22), str(folder / DIFFUSERS_WEIGHTS))
    return folder


def test_wan22_residual_patchified_vae_decode_equals_diffusers(wan22_vae: Path) -> None:
    from diffusers import AutoencoderKLWan

    reference = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(wan22_vae))
    reference.load_state_dict(load_file(str(wan22_vae / DIFFUSERS_WEIGHTS)), strict=True)
    reference = reference.to(torch.float64).eval()
    config = WanVaeConfig.from_dict(json.loads((wan22_vae / "config.json").read_text()))
    ours = load_vae(wan22_vae, config, torch.float64, "cpu")
    for latents in (seeded(1, 4, 3, 2, 3, seed=6), seeded(1, 4, 1, 2, 2, seed=7)):
        got = ours.decode(latents)
        with torch.no_grad():
            expected = reference.decode(latents, return_dict=False)[0]
        frames = ours.output_frames(latents.shape[2])
        assert got.shape == (1, 3, frames, 16 * latents.shape[3], 16 * latents.shape[4])
        assert_close(got, expected)
    whole = ours.decode_chunk(seeded(1, 4, 3, 2, 3, seed=6), None)
    assert torch.allclose(whole, ours.decode(seeded(1, 4, 3, 2, 3, seed=6)), atol=1e-12, rtol=0)
