"""The engine's one batcher runs MoT denoise steps beside AR tokens: think-then-draw and chat
requests interleaved in one engine (steps holding both kinds) give, in float64, bit-identical
tokens to each request alone and latents equal to float64 rounding; a drawing attends to its
own AR loop's blocks (moved, not copied) and equals the float64 reference over its prompt and
thought; a cancelled request leaks no block in either loop; a chat never runs the image heads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tests.runtime.engine.mot_helpers import (
    IMAGE,
    Finals,
    chat,
    draw,
    engine,
    reference_latents,
)

from loom_runtime.engine.build import build_lane
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.denoise_lane import DenoiseLane, pick_denoise
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.transfer_port import DisaggSettings
from loom_runtime.engine.types import DrawSpec, EngineRequest
from loom_runtime.errors import InvalidRequestError
from loom_runtime.loop.contract import WorkPlan
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.mot.image_heads import ImageHeads
from loom_runtime.models.mot.tiny import write_mot_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("denoise-lane") / "mot"
    return write_mot_checkpoint(root, seed=3, std=0.08, num_hidden_layers=2, image=IMAGE)[0]


@pytest.fixture(scope="module")
def mot64(checkpoint: Path) -> LoadedModel:
    return load_model(checkpoint, dtype=torch.float64)


REQUESTS = [
    draw("d1", [5, 81, 300, 17, 2048, 9, 44], 6, DrawSpec(4, 8, 4, seed=1)),
    chat("c1", [12, 900, 33, 4001, 7, 70, 71, 72, 73, 74, 75], 9),
    draw("d2", [600, 601, 602], 3, DrawSpec(6, 4, 3, seed=2)),
    chat("c2", [40, 41, 42], 14),
    draw("d3", [5, 81, 300, 17, 99], 1, DrawSpec(2, 2, 2, seed=3)),
]


class StepKinds:
    """Which executors each engine step called: 't' (token forward), 'd' (denoise)."""

    def __init__(self, eng: Engine) -> None:
        self.steps: list[set[str]] = []
        self.moved: dict[str, tuple[list[int], tuple[int, ...]]] = {}
        batcher, lane = eng._batcher, eng._lane
        assert lane is not None
        token = batcher.executors  # type: ignore[attr-defined]
        forward = dict(token)
        inner_t, inner_d, take = forward["token_forward"], lane.executor, lane.take

        class Spy:
            def __init__(self, inner: object, tag: str, steps: list[set[str]]) -> None:
                self.inner, self.tag, self.steps = inner, tag, steps

            def execute(self, plans: Sequence[WorkPlan[object]]) -> list[object]:
                self.steps[-1].add(self.tag)
                return self.inner.execute(plans)  # type: ignore[attr-defined,no-any-return]

        def spy_take(text):  # type: ignore[no-untyped-def]
            blocks = list(text.table.block_ids)
            if not take(text):
                return False
            start = lane.drawing[text.request_id].state.start
            self.moved[text.request_id] = (blocks, start.block_table)
            return True

        batcher.executors = {"token_forward": Spy(inner_t, "t", self.steps)}
        lane.executor = Spy(inner_d, "d", self.steps)  # type: ignore[assignment]
        lane.take = spy_take  # type: ignore[method-assign]
        self.eng = eng

    def run(self) -> None:
        while True:
            self.steps.append(set())
            if not self.eng.step():
                self.steps.pop()
                return


def run(
    loaded: LoadedModel, requests: Sequence[EngineRequest], batch_invariant: bool = False
) -> tuple[Finals, StepKinds]:
    """Run `requests` in one engine, caching prefixes in batch-invariant mode only: otherwise a
    prompt whose prefix is cached runs its last token through the CPU decode kernel, which
    accumulates in float32 (a property of the text loop, not of the interleaving), so alone and
    together would differ in that token's KV beyond float64 rounding."""
    eng = engine(loaded, prefix_caching=batch_invariant, batch_invariant=batch_invariant)
    finals = Finals()
    try:
        for req in requests:
            eng.add_request(req, finals)
        kinds = StepKinds(eng)
        kinds.run()
        assert eng._batcher.kv.pool.num_free == eng.num_blocks  # nothing held at the end
    finally:
        eng.shutdown()
    return finals, kinds


def test_interleaved_chats_and_drawings_equal_each_alone_in_float64(mot64, checkpoint) -> None:
    together, kinds = run(mot64, REQUESTS)
    assert {"t", "d"} in kinds.steps  # some step ran AR tokens and denoise steps together
    for req in REQUESTS:
        alone, _ = run(mot64, [req])
        assert together.tokens(req.request_id) == alone.tokens(req.request_id)
        assert len(together.tokens(req.request_id)) == req.sampling.max_tokens
        got, want = together.final(req.request_id), alone.final(req.request_id)
        assert got.finish_reason == want.finish_reason == "length"
        if req.draw is None:
            assert got.latents is None
            continue
        assert got.latents is not None and want.latents is not None
        assert got.latents.shape == (3, req.draw.height, req.draw.width)
        # tokens are bit-identical; the text KV they leave is not: the varlen text forward of a
        # different batch differs in the last bits (DESIGN 1.4), ~1e-15 here, and the latents
        # attend to it, so they are held to float64 rounding, far below any real difference
        # (in batch-invariant mode they are the same bits: the interleave gate below)
        assert (got.latents - want.latents).abs().max().item() < 1e-12
    # each drawing attended to the very blocks its AR loop wrote (moved, not copied)
    for rid, (blocks, table) in kinds.moved.items():
        assert tuple(blocks) == table, rid
    # ... and equals the float64 reference conditioned on its prompt and its thought (the
    # last sampled token never ran through a forward: its KV is not part of the context)
    req = REQUESTS[2]
    context = [*req.prompt_token_ids, *together.tokens(req.request_id)][:-1]
    latents = together.final(req.request_id).latents
    assert latents is not None
    assert (latents - reference_latents(checkpoint, context, req)).abs().max().item() < 1e-6


def interleave_gate(loaded: LoadedModel, batch_invariant: bool = True) -> list[str]:
    """The interleave gate: REQUESTS run together (some steps holding AR tokens and denoise
    steps of different requests) and each alone; the requests whose tokens or latents differ
    in any bit."""
    together, kinds = run(loaded, REQUESTS, batch_invariant)
    assert {"t", "d"} in kinds.steps
    differ = []
    for req in REQUESTS:
        alone, _ = run(loaded, [req], batch_invariant)
        rid = req.request_id
        got, want = together.final(rid).latents, alone.final(rid).latents
        same_latents = (got is None and want is None) or (
            got is not None and want is not None and torch.equal(got, want)
        )
        if together.tokens(rid) != alone.tokens(rid) or not same_latents:
            differ.append(rid)
    return differ


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batch_invariant_interleaving_is_bit_identical_to_each_request_alone(
    checkpoint: Path, dtype: torch.dtype
) -> None:
    """In batch-invariant mode (models/linear.py, models/invariant_attention.py) the text KV a
    request leaves does not depend on what shared its steps, so its latents are the same bits
    too, in float64 and in float32 alike (with torch's own matmuls they are not: the first test
    of this file)."""
    assert interleave_gate(load_model(checkpoint, dtype=dtype)) == []


def test_the_interleave_gate_fails_a_model_that_keeps_module_level_state(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mutant whose image heads keep state beside the requests — the flow times of the first
    call of each row count, reused by every later call of that count — gives drawings another
    result interleaved than alone; the gate names them."""
    first_times: dict[int, torch.Tensor] = {}
    embed = ImageHeads.embed

    def stateful_embed(self: ImageHeads, patches: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return embed(self, patches, first_times.setdefault(len(t), t))

    monkeypatch.setattr(ImageHeads, "embed", stateful_embed)
    differ = interleave_gate(load_model(checkpoint, dtype=torch.float64))
    assert differ and set(differ) <= {r.request_id for r in REQUESTS if r.draw is not None}


def test_a_thought_that_stops_early_draws_from_what_it_wrote(mot64, checkpoint) -> None:
    """The program thinks until a stop id (EOS's mechanism) or max_tokens: stopping on the
    first token leaves the prompt alone as context, and the drawing still runs; its end-to-end
    latency covers the drawing."""
    probe = REQUESTS[2]
    first = run(mot64, [probe])[0].tokens(probe.request_id)[0]
    sampling = replace(probe.sampling, stop_token_ids=(first,))
    stopped, kinds = run(mot64, [replace(probe, sampling=sampling)])
    out = stopped.final(probe.request_id)
    assert stopped.tokens(probe.request_id) == [first] and out.finish_reason == "stop"
    assert out.latents is not None and out.metrics is not None
    context = list(probe.prompt_token_ids)  # the stop token never ran through a forward
    assert (out.latents - reference_latents(checkpoint, context, probe)).abs().max() < 1e-6
    blocks, table = kinds.moved[probe.request_id]
    assert tuple(blocks) == table and len(table) == 1  # 3 prompt tokens: one 4-token block
    assert out.metrics.last_token_time is not None
    assert out.metrics.finished_time >= out.metrics.last_token_time


def test_a_chat_never_runs_the_image_heads(mot64) -> None:
    finals, kinds = run(mot64, [REQUESTS[1], REQUESTS[3]])
    assert kinds.steps and all(step == {"t"} for step in kinds.steps)
    assert finals.final("c1").latents is None and not kinds.moved


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_cancelled_requests_leak_no_block_in_either_loop(mot64, prefix_caching) -> None:
    eng = engine(mot64, prefix_caching)
    lane = eng._lane
    assert isinstance(lane, DenoiseLane)
    finals = Finals()
    try:
        for req in REQUESTS:
            eng.add_request(req, finals)
        eng.step()
        eng.abort("c1")  # in its AR loop
        while "d3" not in lane.drawing:
            assert eng.step()
        drawing = lane.drawing["d3"].state
        assert lane.num_blocks > 0 and drawing.latents.numel() > 0
        eng.abort("d3")  # in its denoise loop
        eng.abort("d1")  # still thinking
        eng.step()
        assert "d3" not in lane.drawing and drawing.latents.numel() == 0  # latents dropped
        while eng.step():
            pass
        assert eng._batcher.kv.pool.num_free == eng.num_blocks
        assert lane.num_blocks == 0 and not lane.drawing
    finally:
        eng.shutdown()
    for rid in ("c1", "d3", "d1"):
        assert finals.final(rid).finish_reason == "abort" and finals.final(rid).latents is None
    assert finals.final("d2").latents is not None and finals.final("c2").finish_reason == "length"


def test_a_failing_denoise_step_aborts_its_drawings_and_frees_them(mot64) -> None:
    class Broken:
        def execute(self, plans: Sequence[WorkPlan[object]]) -> list[object]:
            raise RuntimeError("denoise kernel failed")

    eng = engine(mot64)
    lane = eng._lane
    assert lane is not None
    lane.executor = Broken()  # type: ignore[assignment]
    finals = Finals()
    try:
        for req in (REQUESTS[2], REQUESTS[3]):
            eng.add_request(req, finals)
        while eng.step():
            pass
        assert eng._batcher.kv.pool.num_free == eng.num_blocks and not lane.drawing
    finally:
        eng.shutdown()
    assert finals.final("d2").finish_reason == "abort" and finals.final("d2").latents is None
    assert finals.final("c2").finish_reason == "length"  # the chat beside it is unharmed


def test_bad_drawings_are_refused_at_the_door(mot64, tiny64) -> None:
    eng = engine(mot64)
    try:
        cases = {
            DrawSpec(3, 4, 2): "multiple of the patch size 2",
            DrawSpec(4, 0, 2): "multiple of the patch size 2",
            DrawSpec(4, 4, 0): "num_steps 0",
            DrawSpec(8, 16, 2): "32 tokens per denoise step, over the step budget of 24",
        }
        for spec, message in cases.items():
            with pytest.raises(InvalidRequestError, match=message):
                eng.add_request(draw("x", [1, 2], 1, spec), Finals())
    finally:
        eng.shutdown()
    text = Engine(tiny64, EngineConfig(dtype=torch.float64, max_model_len=64, num_blocks=8))
    try:
        with pytest.raises(InvalidRequestError, match="no denoise loop"):
            text.add_request(draw("x", [1, 2], 1, DrawSpec(2, 2, 1)), Finals())
    finally:
        text.shutdown()


def test_only_an_aggregated_one_process_mot_engine_gets_a_lane(mot64, tiny64) -> None:
    eng = engine(mot64)
    try:
        cache, kv = eng._lane.executor.kv, eng._kv  # type: ignore[union-attr]
        assert build_lane(mot64.model, cache, kv, eng._emit, eng._runner) is not None
        for role in ("prefill", "decode"):
            pd = DisaggSettings(role)  # type: ignore[arg-type]
            assert build_lane(mot64.model, cache, kv, eng._emit, eng._runner, disagg=pd) is None
        assert build_lane(tiny64.model, cache, kv, eng._emit, eng._runner) is None
    finally:
        eng.shutdown()


@pytest.mark.parametrize(
    ("costs", "budget", "expected"),
    [
        ([], 10, 0),
        ([30], 10, 1),  # the oldest always runs
        ([4, 4, 4], 10, 2),
        ([4, 8, 1], 10, 1),  # in order: a smaller later step does not jump the queue
        ([4, 4], 0, 1),
        ([3, 3, 4], 10, 3),
    ],
)
def test_pick_denoise_takes_the_oldest_then_what_fits(costs, budget, expected) -> None:
    assert pick_denoise(costs, budget) == expected
