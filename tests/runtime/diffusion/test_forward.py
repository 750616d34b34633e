"""VaeDecode on the tiny Wan checkpoint (float64): a step's decode plans of one latent shape and
first-chunk status run as one batched decoder call, one StepSample per call with its batch size;
a step mixing two shapes and first- and later-chunk videos gives every video, chunk by chunk, the
pixels it gets decoded alone (torch.equal); a plan with more than one latent row is refused."""

from __future__ import annotations

import pytest
import torch

from loom_runtime.diffusion.forward import VaeDecode, decode_groups
from loom_runtime.diffusion.step_cost import StepSample
from loom_runtime.diffusion.types import VAE_DECODE, DecodeWork, DiffusionResult
from loom_runtime.loop.contract import ResourceRequest, WorkPlan
from loom_runtime.models.wan.loader import LoadedWan, load_wan
from loom_runtime.models.wan.tiny import init_tiny_wan
from loom_runtime.models.wan.vae_cache import CausalCache

SMALL, WIDE = (4, 4), (4, 6)  # latent H x W of the two shapes


@pytest.fixture(scope="module")
def wan64(tmp_path_factory: pytest.TempPathFactory) -> LoadedWan:
    return load_wan(init_tiny_wan(tmp_path_factory.mktemp("wan") / "tiny"), dtype=torch.float64)


def latents(size: tuple[int, int], frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, 4, frames, *size, generator=gen, dtype=torch.float64)


def plan(
    rid: str, video: torch.Tensor, frame: int, cache: CausalCache
) -> WorkPlan[DiffusionResult]:
    work = DecodeWork(video[:, :, frame : frame + 1], cache)
    return WorkPlan("vae_tile", VAE_DECODE, ResourceRequest(), work, request_id=rid)


def alone(wan: LoadedWan, video: torch.Tensor) -> list[torch.Tensor]:
    """Each latent frame's pixels, the video decoded by itself (one call per frame)."""
    decode = VaeDecode(wan.vae)
    cache = wan.vae.new_cache()
    out = []
    for frame in range(video.shape[2]):
        (result,) = decode.execute([plan("alone", video, frame, cache)])
        assert result.pixels is not None
        out.append(result.pixels)
    return out


def test_a_mixed_step_batches_by_shape_and_first_chunk_and_equals_each_video_alone(
    wan64: LoadedWan,
) -> None:
    videos = {  # request id -> (latents, the step it starts decoding at)
        "a": (latents(SMALL, 3, 1), 0), "b": (latents(SMALL, 3, 2), 0),
        "c": (latents(SMALL, 3, 3), 1), "d": (latents(WIDE, 3, 4), 0),
        "e": (latents(WIDE, 2, 5), 1),
    }  # fmt: skip
    samples: list[StepSample] = []
    decode = VaeDecode(wan64.vae, samples.append)
    caches = {rid: wan64.vae.new_cache() for rid in videos}
    got: dict[str, list[torch.Tensor]] = {rid: [] for rid in videos}
    per_step: list[list[tuple[tuple[int, ...], int]]] = []
    for step in range(4):
        plans = [
            plan(rid, x, step - start, caches[rid])
            for rid, (x, start) in videos.items()
            if 0 <= step - start < x.shape[2]
        ]
        before = len(samples)
        for p, result in zip(plans, decode.execute(plans), strict=True):
            assert result.pixels is not None and result.pixels.shape[0] == 1
            got[p.request_id].append(result.pixels)
        per_step.append([(s.signature, s.items) for s in samples[before:]])
    small, wide = (1, 4, 1, *SMALL), (1, 4, 1, *WIDE)
    assert per_step == [
        [(small, 2), (wide, 1)],  # a, b first chunks together; d alone (another shape)
        [(small, 2), (small, 1), (wide, 1), (wide, 1)],  # a b | c first | d | e first
        [(small, 3), (wide, 2)],  # a, b on their last chunk with c on its second; d with e
        [(small, 1)],  # c
    ]
    assert all(s.kind == VAE_DECODE and s.seconds > 0 for s in samples)
    for rid, (x, _) in videos.items():
        expected = alone(wan64, x)
        assert len(got[rid]) == len(expected) == x.shape[2]
        for frame, (mine, theirs) in enumerate(zip(got[rid], expected, strict=True)):
            assert torch.equal(mine, theirs), (rid, frame)
        assert caches[rid].chunks == x.shape[2]


def test_a_decode_plan_with_more_than_one_latent_row_is_refused(wan64: LoadedWan) -> None:
    two = torch.zeros(2, 4, 1, *SMALL, dtype=torch.float64)
    with pytest.raises(ValueError, match="one batch row"):
        decode_groups([DecodeWork(two, wan64.vae.new_cache())])
