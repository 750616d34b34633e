"""Several videos' chunks through one decode_chunk call over a BatchedCausalCache equal each video
decoded alone through its own CausalCache: bit for bit in float64, within FLOAT32_TOLERANCE in
float32; videos at different later chunks share a call; each member keeps its own frames, so one
cleared (cancelled) mid-decode frees them and the others decode on unchanged.

Tolerance (float32): the CPU's float32 convolutions pick kernels by batch size, so a batched
call and a lone one differ in the last bits; we allow 2e-5 absolute (pixels lie in [-1, 1];
measured: 4.5e-6). float64 takes batch-invariant kernels: torch.equal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loom_runtime.models.wan.loader import LoadedWan, load_wan
from loom_runtime.models.wan.vae import WanVaeDecoder
from loom_runtime.models.wan.vae_cache import BatchedCausalCache, CausalCache

FLOAT32_TOLERANCE = 2e-5


def videos(n: int, dtype: torch.dtype, frames: int = 4) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randn(1, 4, frames, 4, 4, generator=gen, dtype=dtype) for _ in range(n)]


def alone(vae: WanVaeDecoder, latents: torch.Tensor) -> torch.Tensor:
    """One video through its own cache, one latent frame per call (as the engine decodes)."""
    cache = vae.new_cache()
    chunks = [vae.decode_chunk(latents[:, :, i : i + 1], cache) for i in range(latents.shape[2])]
    return torch.cat(chunks, dim=2)


def batched(vae: WanVaeDecoder, latents: list[torch.Tensor]) -> list[torch.Tensor]:
    """All videos in lockstep, one decode_chunk call per latent frame over a BatchedCausalCache."""
    caches = [vae.new_cache() for _ in latents]
    chunks = []
    for i in range(latents[0].shape[2]):
        frame = torch.cat([x[:, :, i : i + 1] for x in latents])
        chunks.append(vae.decode_chunk(frame, BatchedCausalCache(caches)))
    assert all(c.chunks == latents[0].shape[2] for c in caches)
    pixels = torch.cat(chunks, dim=2)
    return [pixels[j : j + 1] for j in range(len(latents))]


@pytest.fixture(scope="module")
def ours32(wan_dir: Path) -> LoadedWan:
    return load_wan(wan_dir, dtype=torch.float32)


def test_a_batched_decode_equals_each_video_alone_bit_for_bit_in_float64(ours: LoadedWan) -> None:
    latents = videos(4, torch.float64)
    got = batched(ours.vae, latents)
    for j, x in enumerate(latents):
        expected = alone(ours.vae, x)
        assert expected.shape == (1, 3, 13, 32, 32)
        assert torch.equal(got[j], expected), f"video {j}"
    assert not torch.equal(got[0], got[1])  # different latents, different videos


def test_a_batched_decode_equals_each_video_alone_within_tolerance_in_float32(
    ours32: LoadedWan,
) -> None:
    latents = videos(4, torch.float32)
    got = batched(ours32.vae, latents)
    for j, x in enumerate(latents):
        error = float((got[j] - alone(ours32.vae, x)).abs().max())
        assert error <= FLOAT32_TOLERANCE, f"video {j}: max |batched - alone| = {error:.3g}"


def test_videos_at_different_later_chunks_share_one_call(ours: LoadedWan) -> None:
    """Video a is on its second chunk (its temporal upsamplers' caches still empty), b on its
    fourth: one call decodes both, each as it would alone."""
    a, b = videos(2, torch.float64)
    vae = ours.vae
    ca, cb = vae.new_cache(), vae.new_cache()
    vae.decode_chunk(a[:, :, :1], ca)
    for i in range(3):
        vae.decode_chunk(b[:, :, i : i + 1], cb)
    assert any(s is None for s in ca.slots) and all(s is not None for s in cb.slots)
    pixels = vae.decode_chunk(torch.cat([a[:, :, 1:2], b[:, :, 3:4]]), BatchedCausalCache([ca, cb]))
    assert (ca.chunks, cb.chunks) == (2, 4)
    assert torch.equal(pixels[:1], alone(vae, a[:, :, :2])[:, :, 1:])
    assert torch.equal(pixels[1:], alone(vae, b)[:, :, 9:])


def test_each_member_keeps_its_own_frames_and_a_cleared_one_frees_them(ours: LoadedWan) -> None:
    latents = videos(3, torch.float64, frames=3)
    vae = ours.vae
    caches = [vae.new_cache() for _ in latents]
    first = vae.decode_chunk(torch.cat([x[:, :, :1] for x in latents]), BatchedCausalCache(caches))
    held = [
        {t.untyped_storage().data_ptr() for t in c.slots if t is not None and t.numel()}
        for c in caches
    ]
    assert all(held) and not (held[0] & held[1] or held[0] & held[2] or held[1] & held[2])
    caches[1].clear()  # cancelled mid-decode
    assert caches[1].nbytes == 0 and caches[0].nbytes == caches[2].nbytes > 0
    rest, survivors = [first[::2]], [caches[0], caches[2]]
    for i in (1, 2):
        frame = torch.cat([latents[0][:, :, i : i + 1], latents[2][:, :, i : i + 1]])
        rest.append(vae.decode_chunk(frame, BatchedCausalCache(survivors)))
    pixels = torch.cat(rest, dim=2)
    assert torch.equal(pixels[:1], alone(vae, latents[0]))
    assert torch.equal(pixels[1:], alone(vae, latents[2]))


def test_members_on_their_first_chunk_and_past_it_are_refused_together() -> None:
    started = CausalCache(3)
    started.advance()
    with pytest.raises(ValueError, match="first-chunk"):
        BatchedCausalCache([CausalCache(3), started])
    with pytest.raises(ValueError, match="slot counts"):
        BatchedCausalCache([CausalCache(3), CausalCache(4)])
    with pytest.raises(ValueError, match="at least one"):
        BatchedCausalCache([])
    with pytest.raises(ValueError, match="batch rows"):
        BatchedCausalCache([CausalCache(1), CausalCache(1)]).write(0, torch.zeros(3, 1))
