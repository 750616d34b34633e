"""One step thread for an LLM engine and a diffusion engine on the same worker: the choice by
fair compute time (pure), and the interleave gate — 8 seeded image and video requests of
different sizes and step counts, mixed with LLM decode on the same thread, step by step, give
bit-identical frames and identical tokens to the same requests run one by one (float64)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.diffusion.engine_types import DiffusionEngineConfig
from loom_runtime.diffusion.types import DiffusionOutput, DiffusionRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.shared_step_thread import SharedStepThread, TenantView, catch_up, choose
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.wan.loader import LoadedWan, load_wan
from loom_runtime.models.wan.tiny import init_tiny_wan

TEXT_LEN = 16
PROMPT, NEGATIVE = (5, 17, 33, 2), (9, 41)


def test_the_engine_furthest_behind_in_fair_time_steps_next() -> None:
    llm, dit = TenantView("llm", 1.0, 2.0, 0.01), TenantView("dit", 1.0, 1.0, 0.5)
    assert choose([llm, dit]) == 1  # 1.0 + 0.5 < 2.0 + 0.01
    assert choose([llm, TenantView("dit", 1.0, 1.9, 0.5)]) == 0  # its long step would pass llm
    assert choose([llm, TenantView("dit", 4.0, 7.0, 0.5)]) == 1  # a 4x share: (7 + .5) / 4
    assert choose([TenantView("a", 1, 1, 0), TenantView("b", 1, 1, 0)]) == 0  # ties: the first


def test_an_idle_engine_does_not_bank_its_idle_time() -> None:
    running = [TenantView("llm", 1.0, 10.0, 0.01), TenantView("x", 2.0, 30.0, 0.1)]
    assert catch_up(1.0, 1.0, running) == 10.0  # up to the least virtual time (10 / 1)
    assert catch_up(12.0, 1.0, running) == 12.0  # never moved back
    assert catch_up(1.0, 3.0, running) == 30.0  # in its own share's units
    assert catch_up(1.0, 1.0, []) == 1.0


@pytest.fixture(scope="module")
def wan64(tmp_path_factory: pytest.TempPathFactory) -> LoadedWan:
    return load_wan(init_tiny_wan(tmp_path_factory.mktemp("wan") / "tiny"), dtype=torch.float64)


def diffusion_requests() -> list[DiffusionRequest]:
    return [
        DiffusionRequest(f"d{i}", PROMPT[: 1 + i % 4], height=h, width=w, num_frames=f,
                         num_steps=s, guidance_scale=g, negative_ids=NEGATIVE, seed=i)
        for i, (h, w, f, s, g) in enumerate([
            (32, 32, 1, 2, 1.0), (32, 32, 1, 4, 3.0), (32, 48, 1, 3, 1.0), (32, 32, 5, 2, 2.0),
            (32, 32, 1, 3, 1.0), (48, 32, 1, 1, 5.0), (32, 32, 5, 3, 1.0), (32, 32, 1, 2, 3.0),
        ])
    ]  # fmt: skip


LLM_PROMPTS = [tuple(range(3 + i, 40 + 7 * i)) for i in range(4)]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


def engines(
    tiny64: LoadedModel, wan: LoadedWan, shared_thread: SharedStepThread | None
) -> tuple[Engine, DiffusionEngine]:
    llm = Engine(
        tiny64, EngineConfig(dtype=torch.float64, model_name="llm"), shared_thread=shared_thread
    )
    config = DiffusionEngineConfig(model_name="dit", dtype=torch.float64, text_len=TEXT_LEN,
                                   default_steps=3, max_running=8)  # fmt: skip
    return llm, DiffusionEngine(wan, config, shared_thread=shared_thread)


def alone(tiny64: LoadedModel, wan: LoadedWan) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """Every request on its own (fresh engines, driven on this thread, one at a time)."""
    frames = {}
    for req in diffusion_requests():
        _, dit = engines(tiny64, wan, None)
        outs: list[DiffusionOutput] = []
        dit.add_request(req, outs.append)
        while not outs:
            dit.step()
        frames[req.request_id] = outs[0].frames
    tokens = []
    for prompt in LLM_PROMPTS:
        llm, _ = engines(tiny64, wan, None)
        tokens.append(list(llm.generate(prompt, GREEDY).output_token_ids))
    return frames, tokens


class StepClock:
    """A test double of the thread's clock: every step measures 1 s, so which engine steps
    next is decided by counts, not by how fast this CPU runs each engine (the first LLM step
    prefills four prompts in float64: on a CPU where that is slow, measured time let diffusion
    finish every request before the LLM's turn came back, and nothing interleaved)."""

    def __init__(self) -> None:
        self.calls = 0

    def perf_counter(self) -> float:
        self.calls += 1
        return float(self.calls // 2)


def test_llm_decode_and_diffusion_interleaved_on_one_thread_equal_them_alone(
    tiny64: LoadedModel, wan64: LoadedWan, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames_alone, tokens_alone = alone(tiny64, wan64)
    monkeypatch.setattr("loom_runtime.engine.shared_step_thread.time", StepClock())
    shared_thread = SharedStepThread("test-worker", idle_wait_s=0.05)
    llm, dit = engines(tiny64, wan64, shared_thread)
    order: list[str] = []  # which engine each step that ran something went to

    def recorded(step: Callable[[], bool], name: str) -> Callable[[], bool]:
        def run() -> bool:
            ran = step()
            if ran:
                order.append(name)
            return ran

        return run

    for tenant in shared_thread._tenants:
        tenant.step = recorded(tenant.step, tenant.name)

    done = threading.Event()
    outs: dict[str, DiffusionOutput] = {}

    def on_output(o: DiffusionOutput) -> None:
        outs[o.request_id] = o
        if len(outs) == 8:
            done.set()

    # every request is in before the thread starts, so both engines hold work from the first step
    for req in diffusion_requests():
        dit.add_request(req, on_output)
    collectors = []
    for i, prompt in enumerate(LLM_PROMPTS):
        request = EngineRequest(f"l{i}", prompt, GREEDY)
        collectors.append(OutputCollector(request))
        llm.add_request(request, collectors[-1])
    shared_thread.start()
    try:
        assert done.wait(300)
        deadline = time.monotonic() + 300
        assert all(c.wait(deadline) for c in collectors)  # no drive: the shared thread steps
    finally:
        llm.shutdown()
        dit.shutdown()
    results = [list(c.result().output_token_ids) for c in collectors]
    assert results == tokens_alone
    for rid, expected in frames_alone.items():
        assert outs[rid].finish_reason == "done" and torch.equal(outs[rid].frames, expected), rid
    # step by step on one thread: LLM decode ran while diffusion requests were still denoising
    dits = [i for i, name in enumerate(order) if name == "dit"]
    assert any(dits[0] < i < dits[-1] for i, name in enumerate(order) if name == "llm"), order
    stats = {s.name: s for s in shared_thread.stats()}
    assert stats["llm"].steps > 0 and stats["dit"].steps > 0
    assert stats["dit"].predicted_step_s > 0 and stats["llm"].compute_s > 0


def test_an_engine_on_a_shared_step_thread_pauses_and_reports_that_thread(
    tiny64: LoadedModel, wan64: LoadedWan, tmp_path: Path
) -> None:
    shared_thread = SharedStepThread("pause-test", idle_wait_s=0.05)
    llm, dit = engines(tiny64, wan64, shared_thread)
    assert not llm.step_thread_alive() and not dit.step_thread_alive()
    shared_thread.start()
    assert llm.step_thread_alive() and dit.step_thread_alive()
    try:
        assert list(
            llm.generate(LLM_PROMPTS[0], GREEDY).output_token_ids
        )  # driven by the shared thread
        assert dit.pause("wait", 10) and llm.pause("wait", 10)
        assert not dit.stats().admission_open and not llm.stats().admission_open
    finally:
        llm.shutdown()
        dit.shutdown()
    assert not shared_thread.thread.alive
