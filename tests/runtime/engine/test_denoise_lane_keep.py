"""A keep swap on a MoT engine: new weights swapped in under drawing requests, which go on.
A drawing's next Euler steps run on the new weights; kv "keep" attends to its text KV of the
old weights, kv "recompute" to that KV recomputed under the new ones (into fresh blocks, or,
when none are free yet, once some are: the drawing waits meanwhile). Each equals the float64
reference that switches weights at the same step; nothing leaks; a chat beside it goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.runtime.engine.mot_helpers import (
    IMAGE,
    Finals,
    chat,
    draw,
    engine,
    reference_drawing,
    reference_latents,
    reference_of,
)
from tests.runtime.engine.push_helpers import stage

from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import DrawSpec, EngineRequest
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.models.loader import load_model
from loom_runtime.models.mot.tiny import write_mot_checkpoint
from loom_runtime.transfer.weight_push import StagedPush

DRAW = draw("d1", [5, 81, 300, 17, 2048, 9, 44], 6, DrawSpec(4, 8, 5, seed=1))
CHAT = chat("c1", [40, 41, 42], 30)
SWAP_AT = 2  # denoise steps run on the old weights


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lane-keep")
    old, new = (
        write_mot_checkpoint(root / name, seed=seed, std=0.08, num_hidden_layers=2, image=IMAGE)[0]
        for name, seed in (("old", 3), ("new", 4))
    )
    return old, new


def mot_engine(path: Path) -> Engine:
    return engine(load_model(path, dtype=torch.float64), prefix_caching=False)


def pushed(eng: Engine, new: Path, tmp_path: Path) -> StagedPush:
    model = load_model(new, dtype=torch.float64).model
    tensors: dict[str, torch.Tensor] = model.targets()  # type: ignore[attr-defined]
    assert set(tensors) == set(eng.push_specs())  # the shared stack and the image heads
    return stage(tensors, "v2", tmp_path / "staged-v2")


def until_drawn(eng: Engine, rid: str, steps: int) -> None:
    lane = eng._lane
    assert lane is not None
    while rid not in lane.drawing or lane.drawing[rid].state.step < steps:
        assert eng.step()


def finish(eng: Engine) -> None:
    try:
        while eng.step():
            pass
        assert eng._batcher.kv.pool.num_free == eng.num_blocks  # nothing held at the end
    finally:
        eng.shutdown()


def context_of(finals: Finals, req: EngineRequest) -> list[int]:
    """The drawing's text context: prompt and thought but its last token (never forwarded)."""
    return [*req.prompt_token_ids, *finals.tokens(req.request_id)][:-1]


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_drawing_goes_on_under_new_weights_over_kept_or_recomputed_text_kv(
    checkpoints: tuple[Path, Path], tmp_path: Path, kv: str
) -> None:
    old, new = checkpoints
    eng = mot_engine(old)
    finals = Finals()
    eng.add_request(DRAW, finals)
    eng.add_request(CHAT, finals)
    until_drawn(eng, "d1", SWAP_AT)
    blocks = list(eng._lane.drawing["d1"].table.block_ids)  # type: ignore[union-attr]
    eng.load_pushed_keep(pushed(eng, new, tmp_path), kv)
    drawing = eng._lane.drawing["d1"]  # type: ignore[union-attr]
    assert drawing.state.weights_version == "v2" and not drawing.stale
    assert drawing.state.start.block_table == tuple(drawing.table.block_ids)
    assert len(drawing.table.block_ids) == len(blocks)
    finish(eng)

    out = finals.final("d1")
    assert out.latents is not None and out.weights_version == "v2"
    assert all(o.weights_version == "v1" for o in finals.outputs["d1"] if o.new_token_ids)
    context = context_of(finals, DRAW)
    o, n = reference_of(old), reference_of(new)
    num_after = DRAW.draw.num_steps - SWAP_AT  # type: ignore[union-attr]
    kept, recomputed = [(n, o)] * num_after, [(n, n)] * num_after
    after, other = (kept, recomputed) if kv == "keep" else (recomputed, kept)
    want = reference_drawing([(o, o)] * SWAP_AT + after, context, DRAW)
    assert (out.latents - want).abs().max().item() < 1e-6
    wrong = reference_drawing([(o, o)] * SWAP_AT + other, context, DRAW)
    assert (out.latents - wrong).abs().max().item() > 1e-3  # the two policies are told apart
    assert finals.final("c1").finish_reason == "length"
    assert len(finals.tokens("c1")) == CHAT.sampling.max_tokens


def test_a_drawing_whose_text_kv_finds_no_free_block_waits_then_recomputes(
    checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    """Its old blocks stay held by someone else (here: the test) and no block is free, so its
    recompute waits, the drawing running no step; once blocks are free it recomputes and
    finishes as if it had never waited."""
    old, new = checkpoints
    eng = mot_engine(old)
    finals = Finals()
    eng.add_request(DRAW, finals)
    until_drawn(eng, "d1", SWAP_AT)
    lane, kv = eng._lane, eng._kv
    assert lane is not None
    held = list(lane.drawing["d1"].table.block_ids)
    kv.pool.acquire(held)  # its blocks stay in use after it lets them go
    hog = BlockTable()
    assert kv.grow(hog, kv.pool.num_free * kv.block_size)
    eng.load_pushed_keep(pushed(eng, new, tmp_path), "recompute")
    drawing = lane.drawing["d1"]
    assert drawing.stale and not drawing.table.block_ids
    assert not eng.step() and not eng.step()  # nothing can run: it waits for blocks
    assert drawing.stale and drawing.state.step == SWAP_AT
    kv.pool.release(held)
    kv.free(hog)
    finish(eng)

    out = finals.final("d1")
    o, n = reference_of(old), reference_of(new)
    num_after = DRAW.draw.num_steps - SWAP_AT  # type: ignore[union-attr]
    steps = [(o, o)] * SWAP_AT + [(n, n)] * num_after
    assert out.latents is not None
    want = reference_drawing(steps, context_of(finals, DRAW), DRAW)
    assert (out.latents - want).abs().max().item() < 1e-6


def test_a_request_still_thinking_at_a_recompute_swap_draws_all_under_the_new_weights(
    checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    """Its AR loop re-prefills prompt + thought so far under the new weights (as after a
    preemption) and thinks on; its drawing attends to that KV and runs every step on them."""
    old, new = checkpoints
    eng = mot_engine(old)
    finals = Finals()
    eng.add_request(DRAW, finals)
    while len(finals.tokens("d1")) < 3:
        assert eng.step()
    eng.load_pushed_keep(pushed(eng, new, tmp_path), "recompute")
    finish(eng)

    versions = [o.weights_version for o in finals.outputs["d1"] if o.new_token_ids]
    assert versions[:3] == ["v1"] * 3 and set(versions[3:]) == {"v2"}
    out = finals.final("d1")
    assert out.latents is not None and out.weights_version == "v2"
    want = reference_latents(new, context_of(finals, DRAW), DRAW)
    assert (out.latents - want).abs().max().item() < 1e-6
