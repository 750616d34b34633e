"""The MoT denoise loop on the loop contract: interleaved requests (different sizes, step counts
and texts) equal each one alone, and N Euler steps equal the float64 reference's, over text KV
that the text forward wrote and no step rewrites."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from tests.runtime.models.mot.reference import ReferenceMot
from tests.runtime.models.paged_batch import paged_batch

from loom_runtime.engine.denoise_loop import (
    DENOISE_STEP,
    DenoiseStart,
    DenoiseState,
    MotDenoiseExecutor,
    MotDenoiseLoop,
)
from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.loop import Done, LoopContext, WorkPlan, execute_plans
from loom_runtime.models.loader import load_model, read_weights
from loom_runtime.models.mot.model import MotForCausalLM
from loom_runtime.models.mot.tiny import write_mot_checkpoint

TEXTS = {"a": [5, 81, 300, 17, 2048, 9, 44, 610, 3], "b": [12, 900, 33, 4001, 7]}
IMAGE = {"latent_channels": 3, "patch_size": 2, "frequency_dim": 32}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("denoise-loop") / "mot"
    return write_mot_checkpoint(root, seed=5, std=0.08, num_hidden_layers=2, image=IMAGE)[0]


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> MotForCausalLM:
    loaded = load_model(checkpoint, dtype=torch.float64).model
    assert isinstance(loaded, MotForCausalLM)
    return loaded


def text_kv(model: MotForCausalLM) -> tuple[PagedKVCache, dict[str, list[int]]]:
    """The texts' K/V written by one prefill forward into shuffled 4-token blocks."""
    kv = PagedKVCache(model.config.kv_spec(4, 16, torch.float64))
    free = list(range(16))
    random.Random(3).shuffle(free)
    tables: dict[str, list[int]] = {}
    model.forward(paged_batch(list(TEXTS.items()), tables, {}, free, 4, True), kv)
    return kv, tables


def starts(tables: dict[str, list[int]]) -> list[DenoiseStart]:
    gen = torch.Generator().manual_seed(11)

    def noise(h: int, w: int) -> torch.Tensor:
        return torch.randn(3, h, w, generator=gen, dtype=torch.float64)

    return [
        DenoiseStart("a", noise(4, 6), 4, len(TEXTS["a"]), tuple(tables["a"])),
        DenoiseStart("b", noise(2, 4), 2, len(TEXTS["b"]), tuple(tables["b"])),
        DenoiseStart("u", noise(4, 4), 3, 0, ()),  # unconditional
    ]


def drive(
    loop: MotDenoiseLoop, executor: MotDenoiseExecutor, begin: list[DenoiseStart]
) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Run the loops together (each scheduler step takes every unfinished loop's plan): each
    request's final latents, and how many plans each step ran."""
    states = [loop.init(s, LoopContext(weights_version="v1")) for s in begin]
    widths = []
    while True:
        pending: list[tuple[DenoiseState, WorkPlan[torch.Tensor]]] = []
        for state in states:
            plan = loop.next(state)
            if not isinstance(plan, Done):
                pending.append((state, plan))
        if not pending:
            return {s.request_id: loop.finalize(s) for s in states}, widths
        results = execute_plans([p for _, p in pending], {DENOISE_STEP: executor})
        widths.append(len(pending))
        for (state, _), velocity in zip(pending, results, strict=True):
            loop.advance(state, velocity)


def test_interleaved_denoise_loops_equal_each_alone_and_the_reference(model, checkpoint) -> None:
    kv, tables = text_kv(model)
    pool = kv.data.clone()
    loop, executor = MotDenoiseLoop(patch_size=2), MotDenoiseExecutor(model, kv)
    begin = starts(tables)
    together, widths = drive(loop, executor, begin)
    assert widths == [3, 3, 2, 1]  # b finishes after 2 steps, u after 3, a after 4
    config = json.loads((checkpoint / "config.json").read_text())
    reference = ReferenceMot(read_weights(checkpoint), config)
    for start in begin:
        alone, _ = drive(loop, executor, [start])
        assert torch.allclose(together[start.request_id], alone[start.request_id], atol=1e-10)
        expected = start.noise.clone()
        tokens = TEXTS.get(start.request_id, [])
        for i in range(start.num_steps):
            t, t_next = 1 - i / start.num_steps, 1 - (i + 1) / start.num_steps
            expected = expected + (t_next - t) * reference.velocity(tokens, expected, t)
        got = together[start.request_id]
        assert (got - expected).abs().max().item() < 1e-6
        assert (got - start.noise).abs().max().item() > 0.1  # the steps moved the latents
    assert torch.equal(kv.data, pool)  # no step wrote the text KV


def test_a_plan_costs_its_latent_tokens_and_the_loop_ends_done(model) -> None:
    kv, tables = text_kv(model)
    loop = MotDenoiseLoop(patch_size=2)
    state = loop.init(starts(tables)[0], LoopContext(weights_version="v7"))
    assert state.weights_version == "v7"
    for _ in range(4):
        plan = loop.next(state)
        assert isinstance(plan, WorkPlan)
        assert plan.shape == DENOISE_STEP and plan.resources.compute_tokens == 6
        assert not plan.splittable and plan.request_id == "a"
        loop.advance(state, torch.zeros_like(state.latents))
    assert isinstance(loop.next(state), Done)
    assert torch.equal(loop.finalize(state), starts(tables)[0].noise)  # zero velocity: no move
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        loop.init(DenoiseStart("z", torch.zeros(3, 2, 2), 0, 0, ()), LoopContext())
    with pytest.raises(TypeError, match="no denoise step"):
        MotDenoiseExecutor(model, kv).execute([WorkPlan("x", DENOISE_STEP, plan.resources)])
