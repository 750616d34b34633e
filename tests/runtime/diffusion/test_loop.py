"""The diffusion loop on the tiny Wan checkpoint: a seeded generation equals diffusers' WanPipeline
(C1) for an image and a video, with and without guidance; requests of different sizes and step
counts interleaved step by step give bit-identical outputs to the same requests one at a time; a
distilled card refuses other step counts; bad sizes are 400s; an abort frees the request, also
mid-decode from a batched VAE call (the other video decodes on unchanged)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from loom_runtime.diffusion.batcher import DiffusionBatcher
from loom_runtime.diffusion.forward import wan_executors, wan_shape
from loom_runtime.diffusion.loop import DiffusionLoop
from loom_runtime.diffusion.types import DiffusionOutput, DiffusionRequest
from loom_runtime.errors import InvalidRequestError
from loom_runtime.loop.contract import LoopContext
from loom_runtime.models.wan.loader import LoadedWan, load_wan
from loom_runtime.models.wan.tiny import init_tiny_wan
from loom_runtime.testing.wan_reference import reference_embeds as wan_reference_embeds
from loom_runtime.testing.wan_reference import wan_pipeline

TEXT_LEN = 16
C1_TOLERANCE = 1e-6  # float64 compute on both sides, frames returned as float32 (pixels in 0..1)


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_wan(tmp_path_factory.mktemp("wan") / "tiny")


@pytest.fixture(scope="module")
def wan64(wan_dir: Path) -> LoadedWan:
    return load_wan(wan_dir, dtype=torch.float64)


@pytest.fixture(scope="module")
def wan32(wan_dir: Path) -> LoadedWan:
    return load_wan(wan_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def pipeline(wan_dir: Path) -> Any:
    """diffusers' WanPipeline over the same folders, float64 (the references of the C0 tests)."""
    return wan_pipeline(wan_dir, torch.float64)


def reference_embeds(pipe: Any, ids: tuple[int, ...]) -> torch.Tensor:
    return wan_reference_embeds(pipe, ids, TEXT_LEN)


def run(
    wan: LoadedWan, requests: list[DiffusionRequest], pinned: int | None = None
) -> dict[str, DiffusionOutput]:
    """Every request through one DiffusionBatcher, all admitted together (interleaved)."""
    loop = DiffusionLoop(wan_shape(wan, TEXT_LEN), default_steps=3, pinned_steps=pinned)
    outputs: dict[str, DiffusionOutput] = {}
    batcher = DiffusionBatcher(
        loop, wan_executors(wan, TEXT_LEN), lambda o: outputs.update({o.request_id: o}), 16
    )
    for req in requests:
        batcher.add(loop.init(req, LoopContext()))
    while batcher.step():
        pass
    return outputs


PROMPT = (5, 17, 33, 2)
NEGATIVE = (9, 41)


@pytest.mark.parametrize(
    ("frames", "guidance"), [(1, 1.0), (1, 4.0), (5, 3.0)], ids=["image", "image-cfg", "video-cfg"]
)
def test_a_seeded_generation_equals_diffusers_wan_pipeline(
    wan64: LoadedWan, pipeline: Any, frames: int, guidance: float
) -> None:
    req = DiffusionRequest(
        "r", PROMPT, height=32, width=48, num_frames=frames, num_steps=3,
        guidance_scale=guidance, negative_ids=NEGATIVE, seed=7,
    )  # fmt: skip
    ours = run(wan64, [req])["r"]
    theirs = pipeline(
        prompt_embeds=reference_embeds(pipeline, PROMPT),
        negative_prompt_embeds=reference_embeds(pipeline, NEGATIVE) if guidance > 1 else None,
        height=32, width=48, num_frames=frames, num_inference_steps=3,
        guidance_scale=guidance, generator=torch.Generator().manual_seed(7), output_type="np",
    ).frames[0]  # fmt: skip
    assert ours.finish_reason == "done" and ours.num_steps == 3
    assert tuple(ours.frames.shape) == theirs.shape == (frames, 32, 48, 3)
    assert float((ours.frames - torch.from_numpy(theirs)).abs().max()) < C1_TOLERANCE
    assert float(ours.frames.std()) > 0.01  # a real picture, not a constant


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_interleaved_requests_equal_one_at_a_time(
    dtype: str, request: pytest.FixtureRequest
) -> None:
    """Bit-identical in float64. In float32 a batched DiT forward is not batch-invariant on
    this CPU (the GEMM kernels chosen depend on the batch's rows), so interleaved and alone
    differ in the last bits: bounded here, and named in the README's "Not yet"."""
    wan: LoadedWan = request.getfixturevalue("wan64" if dtype == "float64" else "wan32")
    requests = [
        DiffusionRequest(f"r{i}", PROMPT[: 1 + i % 4], height=h, width=w, num_frames=f,
                         num_steps=s, guidance_scale=g, negative_ids=NEGATIVE, seed=i)
        for i, (h, w, f, s, g) in enumerate([
            (32, 32, 1, 2, 1.0), (32, 32, 1, 4, 3.0), (32, 48, 1, 3, 1.0), (32, 32, 5, 2, 2.0),
            (32, 32, 1, 3, 1.0), (48, 32, 1, 1, 5.0), (32, 32, 5, 3, 1.0), (32, 32, 1, 2, 3.0),
        ])
    ]  # fmt: skip
    together = run(wan, requests)
    for req in requests:
        alone = run(wan, [req])[req.request_id].frames
        mixed = together[req.request_id].frames
        if dtype == "float64":
            assert torch.equal(mixed, alone), req.request_id
        else:
            assert float((mixed - alone).abs().max()) < 1e-5, req.request_id


def test_a_distilled_card_refuses_other_step_counts(wan64: LoadedWan) -> None:
    loop = DiffusionLoop(wan_shape(wan64, TEXT_LEN), default_steps=4, pinned_steps=4)
    with pytest.raises(InvalidRequestError, match="distilled for exactly 4"):
        loop.init(DiffusionRequest("r", PROMPT, 32, 32, num_steps=50), LoopContext())
    assert loop.init(DiffusionRequest("r", PROMPT, 32, 32), LoopContext()).schedule.num_steps == 4
    with pytest.raises(ValueError, match="distilled for 4"):
        DiffusionLoop(wan_shape(wan64, TEXT_LEN), default_steps=50, pinned_steps=4)


@pytest.mark.parametrize(
    ("height", "width", "frames", "steps", "match"),
    [
        (30, 32, 1, 2, "multiples of 16"),
        (0, 32, 1, 2, "multiples of 16"),
        (32, 32, 4, 2, "num_frames 4"),
        (32, 32, 1, -1, "steps must be >= 1"),
    ],
)
def test_bad_requests_are_invalid_request_errors(
    wan64: LoadedWan, height: int, width: int, frames: int, steps: int, match: str
) -> None:
    loop = DiffusionLoop(wan_shape(wan64, TEXT_LEN), default_steps=3)
    req = DiffusionRequest("r", PROMPT, height, width, num_frames=frames, num_steps=steps)
    with pytest.raises(InvalidRequestError, match=match):
        loop.init(req, LoopContext())


def test_an_abort_mid_denoise_finishes_the_request_and_frees_it(wan64: LoadedWan) -> None:
    loop = DiffusionLoop(wan_shape(wan64, TEXT_LEN), default_steps=5)
    outputs: list[DiffusionOutput] = []
    batcher = DiffusionBatcher(loop, wan_executors(wan64, TEXT_LEN), outputs.append)
    state = loop.init(DiffusionRequest("r", PROMPT, 32, 32, num_frames=5), LoopContext())
    batcher.add(state)
    for _ in range(3):  # encode, then two denoise steps
        batcher.step()
    assert state.progress == (2, 5)
    batcher.abort({"r"})
    assert [o.finish_reason for o in outputs] == ["abort"] and outputs[0].num_steps == 2
    assert not batcher.has_work and state.text is None and not state.chunks


def test_an_abort_mid_decode_frees_its_cache_and_the_video_batched_with_it_decodes_on(
    wan64: LoadedWan,
) -> None:
    """Two same-shaped videos decode their latent frames in one batched call each step; one is
    cancelled after its first frame: its cache is freed, the other's output is unchanged."""
    loop = DiffusionLoop(wan_shape(wan64, TEXT_LEN), default_steps=3)  # as run()'s
    outputs: dict[str, DiffusionOutput] = {}
    batcher = DiffusionBatcher(
        loop, wan_executors(wan64, TEXT_LEN), lambda o: outputs.update({o.request_id: o})
    )
    reqs = [DiffusionRequest(r, PROMPT, 32, 32, num_frames=9, seed=i) for i, r in enumerate("ab")]
    states = [loop.init(req, LoopContext()) for req in reqs]
    for state in states:
        batcher.add(state)
    while not all(s.phase == "decode" and len(s.chunks) == 1 for s in states):
        assert batcher.step()
    cancelled = states[0].cache
    assert cancelled is not None and cancelled.nbytes > 0 and states[1].cache is not None
    batcher.abort({"a"})
    assert outputs["a"].finish_reason == "abort" and not states[0].chunks
    assert cancelled.nbytes == 0 and all(slot is None for slot in cancelled.slots)
    while batcher.step():
        pass
    assert outputs["b"].finish_reason == "done"
    assert torch.equal(outputs["b"].frames, run(wan64, [reqs[1]])["b"].frames)
