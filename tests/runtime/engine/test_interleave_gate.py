"""The interleave gate across loop kinds, in one worker: a MoT engine (think-then-draw programs
and chats, batch-invariant mode) and a Wan diffusion engine (images and a video) on one
shared step thread, every request in before it starts, give — step by step interleaved, the
MoT engine's steps themselves holding AR tokens and denoise steps of different requests — the
same tokens, latents and frames, bit for bit in float64, as each request run alone."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
from tests.runtime.engine.mot_helpers import IMAGE, Finals, chat, draw, engine
from tests.runtime.engine.test_shared_step_thread import StepClock, diffusion_requests

from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.diffusion.engine_types import DiffusionEngineConfig
from loom_runtime.diffusion.types import DiffusionOutput, DiffusionRequest
from loom_runtime.engine.shared_step_thread import SharedStepThread
from loom_runtime.engine.types import DrawSpec, EngineRequest
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.mot.tiny import write_mot_checkpoint
from loom_runtime.models.wan.loader import LoadedWan, load_wan
from loom_runtime.models.wan.tiny import init_tiny_wan

MOT_REQUESTS = [
    draw("m1", [5, 81, 300, 17, 2048, 9, 44], 6, DrawSpec(4, 8, 4, seed=1)),
    chat("m2", [12, 900, 33, 4001, 7, 70, 71, 72, 73, 74, 75], 9),
    draw("m3", [600, 601, 602], 3, DrawSpec(6, 4, 3, seed=2)),
]


def wan_requests() -> list[DiffusionRequest]:
    """Two images and a video of the Wan gate's requests (sizes, steps and guidance differ)."""
    every = diffusion_requests()
    return [every[1], every[3], every[5]]


@pytest.fixture(scope="module")
def mot64(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    root = tmp_path_factory.mktemp("gate-mot") / "mot"
    path = write_mot_checkpoint(root, seed=3, std=0.08, num_hidden_layers=2, image=IMAGE)[0]
    return load_model(path, dtype=torch.float64)


@pytest.fixture(scope="module")
def wan64(tmp_path_factory: pytest.TempPathFactory) -> LoadedWan:
    return load_wan(init_tiny_wan(tmp_path_factory.mktemp("gate-wan") / "tiny"), torch.float64)


def wan_engine(wan: LoadedWan, shared_thread: SharedStepThread | None) -> DiffusionEngine:
    config = DiffusionEngineConfig(model_name="dit", dtype=torch.float64, text_len=16,
                                   default_steps=3, max_running=8)  # fmt: skip
    return DiffusionEngine(wan, config, shared_thread=shared_thread)


def mot_alone(mot: LoadedModel, req: EngineRequest) -> Finals:
    eng = engine(mot, prefix_caching=True, batch_invariant=True)
    finals = Finals()
    try:
        eng.add_request(req, finals)
        while eng.step():
            pass
    finally:
        eng.shutdown()
    return finals


def wan_alone(wan: LoadedWan, req: DiffusionRequest) -> torch.Tensor:
    dit = wan_engine(wan, None)
    outs: list[DiffusionOutput] = []
    dit.add_request(req, outs.append)
    while not outs:
        dit.step()
    return outs[0].frames


def test_mot_programs_chats_and_wan_jobs_interleaved_in_one_worker_equal_each_alone(
    mot64: LoadedModel, wan64: LoadedWan, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone_mot = {r.request_id: mot_alone(mot64, r) for r in MOT_REQUESTS}
    alone_wan = {r.request_id: wan_alone(wan64, r) for r in wan_requests()}

    monkeypatch.setattr("loom_runtime.engine.shared_step_thread.time", StepClock())
    shared_thread = SharedStepThread("gate-worker", idle_wait_s=0.05)
    mot = engine(mot64, prefix_caching=True, batch_invariant=True, shared_thread=shared_thread)
    dit = wan_engine(wan64, shared_thread)
    order: list[str] = []  # which engine each step that ran something went to
    mot_kinds: list[set[str]] = []  # per MoT step: "t" (AR tokens made), "d" (denoise steps)
    finals, done = Finals(), threading.Event()

    def recorded(step: Callable[[], bool], name: str) -> Callable[[], bool]:
        def run() -> bool:
            lane = mot._lane
            assert lane is not None
            tokens = sum(len(finals.tokens(r.request_id)) for r in MOT_REQUESTS)
            drawing = {rid: d.state.step for rid, d in lane.drawing.items()}
            ran = step()
            if ran:
                order.append("dit" if name == "dit" else "mot")  # the MoT engine's: "loom"
            if ran and name != "dit":
                made = sum(len(finals.tokens(r.request_id)) for r in MOT_REQUESTS) > tokens
                drew = any(drawing.get(rid, -1) != d.state.step for rid, d in lane.drawing.items())
                mot_kinds.append({k for k, on in (("t", made), ("d", drew)) if on})
            return ran

        return run

    for tenant in shared_thread._tenants:
        tenant.step = recorded(tenant.step, tenant.name)

    wanted = {r.request_id for r in MOT_REQUESTS} | {r.request_id for r in wan_requests()}
    outs: dict[str, DiffusionOutput] = {}

    def check_done() -> None:
        finished = {rid for rid, got in finals.outputs.items() if got and got[-1].finished}
        if finished | set(outs) == wanted:
            done.set()

    def on_mot(out: object) -> None:
        finals(out)  # type: ignore[arg-type]
        check_done()

    def on_wan(out: DiffusionOutput) -> None:
        outs[out.request_id] = out
        check_done()

    for req in wan_requests():
        dit.add_request(req, on_wan)
    for mreq in MOT_REQUESTS:
        mot.add_request(mreq, on_mot)
    shared_thread.start()
    try:
        assert done.wait(300)
    finally:
        mot.shutdown()
        dit.shutdown()

    for rid, want in alone_wan.items():
        assert outs[rid].finish_reason == "done" and torch.equal(outs[rid].frames, want), rid
    for mreq in MOT_REQUESTS:
        rid, want = mreq.request_id, alone_mot[mreq.request_id]
        assert finals.tokens(rid) == want.tokens(rid), rid
        got_latents, want_latents = finals.final(rid).latents, want.final(rid).latents
        if mreq.draw is None:
            assert got_latents is None and want_latents is None
        else:
            assert got_latents is not None and want_latents is not None
            assert torch.equal(got_latents, want_latents), rid
    # step by step on one thread: MoT steps ran while Wan jobs were still denoising ...
    dits = [i for i, name in enumerate(order) if name == "dit"]
    assert any(dits[0] < i < dits[-1] for i, name in enumerate(order) if name == "mot"), order
    # ... and some MoT step held AR tokens and denoise steps of different requests
    assert {"t", "d"} in mot_kinds, mot_kinds
