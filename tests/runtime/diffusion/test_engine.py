"""The diffusion engine on the tiny Wan checkpoint: memory is reserved for a request's peak before
it runs and is back to zero after it ends or is cancelled; a request that can never fit is a 400
holding nothing; one that fits later waits; cached prompts skip the encode plan; a DiT sync keeps
the encoder cache, an encoder sync drops it; the step thread serves requests end to end; every
forward is measured into the step cost model, whose prediction admission reads against the step
budget."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.diffusion.engine_types import DiffusionEngineConfig
from loom_runtime.diffusion.step_cost import StepSample
from loom_runtime.diffusion.types import DiffusionOutput, DiffusionRequest
from loom_runtime.errors import AdmissionError, InvalidRequestError
from loom_runtime.models.wan.loader import LoadedWan, load_wan
from loom_runtime.models.wan.tiny import init_tiny_wan

TEXT_LEN = 16
PROMPT = (5, 17, 33, 2)


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_wan(tmp_path_factory.mktemp("wan") / "tiny")


@pytest.fixture(scope="module")
def other_wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same architecture with other weights."""
    return init_tiny_wan(tmp_path_factory.mktemp("wan2") / "tiny", seed=1)


@pytest.fixture
def wan(wan_dir: Path) -> LoadedWan:
    return load_wan(wan_dir)


def make(wan: LoadedWan, **overrides: object) -> DiffusionEngine:
    settings: dict[str, object] = {"text_len": TEXT_LEN, "default_steps": 3, **overrides}
    return DiffusionEngine(wan, DiffusionEngineConfig(**settings))


def video(rid: str, frames: int = 5, prompt: tuple[int, ...] = PROMPT) -> DiffusionRequest:
    return DiffusionRequest(rid, prompt, height=32, width=32, num_frames=frames, seed=3)


def collect() -> tuple[dict[str, DiffusionOutput], Callable[[DiffusionOutput], None]]:
    outs: dict[str, DiffusionOutput] = {}
    return outs, lambda o: outs.update({o.request_id: o})


def drive(engine: DiffusionEngine) -> None:
    for _ in range(200):
        if not engine.in_flight():
            return
        engine.step()
    raise AssertionError("requests did not finish in 200 steps")


def test_cancelling_a_running_request_frees_all_its_memory(wan: LoadedWan) -> None:
    engine = make(wan)
    outs, emit = collect()
    engine.add_request(video("v"), emit)
    engine.step()  # encode
    engine.step()  # first denoise step
    p = engine.progress("v")
    assert p is not None and (p.status, p.steps_done, p.steps_total) == ("in_progress", 1, 3)
    assert engine.stats().memory_reserved_bytes == engine.peak_bytes(video("v")) > 0
    engine.abort("v")
    engine.step()
    assert outs["v"].finish_reason == "abort" and outs["v"].num_steps == 1
    s = engine.stats()
    assert (s.memory_reserved_bytes, s.num_running, s.num_waiting) == (0, 0, 0)
    assert engine.in_flight() == 0 and engine.progress("v") is None


def test_a_request_that_can_never_fit_the_budget_is_a_400_and_holds_nothing(
    wan: LoadedWan,
) -> None:
    image = DiffusionRequest("i", PROMPT, height=32, width=32)
    engine = make(wan, memory_budget_bytes=make(wan).peak_bytes(image))
    outs, emit = collect()
    with pytest.raises(InvalidRequestError, match="budget") as err:
        engine.add_request(video("too-long", frames=9), emit)
    assert err.value.param == "num_frames"
    assert engine.in_flight() == 0 and engine.stats().memory_reserved_bytes == 0
    engine.add_request(image, emit)
    drive(engine)
    assert outs["i"].finish_reason == "done"


def test_a_request_that_fits_later_waits_for_the_memory_of_a_running_one(
    wan: LoadedWan,
) -> None:
    peak = make(wan).peak_bytes(video("a"))
    engine = make(wan, memory_budget_bytes=peak + peak // 2)
    outs, emit = collect()
    engine.add_request(video("a"), emit)
    engine.add_request(video("b"), emit)
    engine.step()
    a, b = engine.progress("a"), engine.progress("b")
    assert a is not None and a.status == "in_progress"
    assert b is not None and (b.status, b.reserved_bytes) == ("queued", 0)
    assert engine.stats().memory_reserved_bytes == peak
    drive(engine)
    assert {o.finish_reason for o in outs.values()} == {"done"}
    assert torch.equal(outs["a"].frames, outs["b"].frames)  # same seed and prompt
    assert engine.stats().memory_reserved_bytes == 0


def test_negative_steps_and_bad_sizes_are_refused_before_anything_is_held(
    wan: LoadedWan,
) -> None:
    engine = make(wan)
    _, emit = collect()
    for req in (
        DiffusionRequest("s", PROMPT, height=32, width=32, num_steps=-1),
        DiffusionRequest("z", PROMPT, height=30, width=32),
        DiffusionRequest("f", PROMPT, height=32, width=32, num_frames=4),
    ):
        with pytest.raises(InvalidRequestError):
            engine.add_request(req, emit)
    assert engine.in_flight() == 0 and engine.stats().num_waiting == 0


def test_a_full_queue_refuses_with_503_and_holds_nothing_more(wan: LoadedWan) -> None:
    engine = make(wan, max_waiting=1)
    _, emit = collect()
    engine.add_request(video("queued"), emit)
    with pytest.raises(AdmissionError, match="max_waiting 1"):
        engine.add_request(video("refused"), emit)
    assert engine.in_flight() == 1 and engine.progress("refused") is None
    engine.abort("queued")
    engine.step()  # never reserved, aborted from the queue
    assert engine.in_flight() == 0 and engine.stats().requests_aborted == 1


def test_a_distilled_engine_refuses_other_step_counts(wan: LoadedWan) -> None:
    engine = make(wan, default_steps=4, pinned_steps=4)
    _, emit = collect()
    with pytest.raises(InvalidRequestError, match="distilled for exactly 4"):
        engine.add_request(DiffusionRequest("d", PROMPT, height=32, width=32, num_steps=50), emit)
    assert engine.in_flight() == 0


def test_a_cached_prompt_skips_its_encode_plan(wan: LoadedWan) -> None:
    engine = make(wan)
    outs, emit = collect()
    engine.add_request(video("first", frames=1), emit)
    drive(engine)
    assert (engine.stats().text_cache_hits, engine.stats().text_cache_misses) == (0, 1)
    engine.add_request(video("again", frames=1), emit)
    engine.step()  # its first step is already a denoise step: no encode plan
    p = engine.progress("again")
    assert p is not None and p.steps_done == 1
    drive(engine)
    assert engine.stats().text_cache_hits == 1
    assert torch.equal(outs["first"].frames, outs["again"].frames)


def test_a_dit_sync_keeps_encoder_hits_and_an_encoder_sync_drops_them(
    wan: LoadedWan, other_wan_dir: Path
) -> None:
    engine = make(wan)
    outs, emit = collect()

    def run(rid: str) -> DiffusionOutput:
        engine.add_request(video(rid, frames=1), emit)
        drive(engine)
        return outs[rid]

    before = run("v1")
    assert engine.pause("wait", timeout=5)
    with pytest.raises(AdmissionError):
        engine.add_request(video("closed"), emit)
    engine.load_component("transformer", other_wan_dir / "transformer", "v2")
    engine.resume()
    after_dit = run("dit-v2")
    s = engine.stats()
    assert (s.text_cache_hits, s.text_cache_entries, s.versions.transformer) == (1, 1, "v2")
    assert not torch.equal(before.frames, after_dit.frames)  # the new DiT ran
    engine.pause("wait", timeout=5)
    engine.load_component("text_encoder", other_wan_dir / "text_encoder", "v2")
    assert engine.stats().text_cache_entries == 0
    engine.resume()
    run("enc-v2")
    s = engine.stats()
    assert (s.text_cache_hits, s.text_cache_misses) == (1, 2)
    assert s.versions.text_encoder == "v2"


def test_load_component_refuses_while_requests_are_in_flight(
    wan: LoadedWan, other_wan_dir: Path
) -> None:
    engine = make(wan)
    _, emit = collect()
    engine.add_request(video("busy"), emit)
    with pytest.raises(AdmissionError, match="pause"):
        engine.load_component("transformer", other_wan_dir / "transformer", "v2")


def test_the_step_thread_runs_requests_and_shutdown_aborts_the_rest(wan: LoadedWan) -> None:
    engine = make(wan)
    engine.start()
    done = threading.Event()
    outs: dict[str, DiffusionOutput] = {}

    def emit(o: DiffusionOutput) -> None:
        outs[o.request_id] = o
        done.set()

    engine.add_request(video("t", frames=1), emit)
    assert done.wait(60)
    assert outs["t"].finish_reason == "done" and tuple(outs["t"].frames.shape) == (1, 32, 32, 3)
    engine.add_request(video("long"), emit)
    engine.shutdown(timeout=30)
    assert outs["long"].finish_reason == "abort" or outs["long"].finish_reason == "done"
    assert engine.in_flight() == 0 and engine.stats().memory_reserved_bytes == 0


def test_every_forward_is_measured_into_the_step_cost_model(wan: LoadedWan) -> None:
    engine = make(wan)
    outs, emit = collect()
    guided = DiffusionRequest("g", PROMPT, height=32, width=32, num_frames=5, seed=3,
                              guidance_scale=4.0, negative_ids=(9, 41))  # fmt: skip
    engine.add_request(guided, emit)
    drive(engine)
    assert outs["g"].finish_reason == "done"
    costs = {k.kind: k for k in engine.stats().step_costs}
    # one encode forward (prompt + negative), 3 denoise forwards, 2 latent frames decoded
    assert {kind: c.samples for kind, c in costs.items()} == {
        "text_encode": 1, "denoise": 3, "vae_decode": 2,
    }  # fmt: skip
    assert all(0 < c.cost.seconds(1) < 5 for c in costs.values())
    denoise = engine.costs.cost("denoise", (1, 4, 2, 4, 4))  # this request's latents' own fit
    assert denoise == costs["denoise"].cost


def test_the_step_budget_admits_requests_while_their_predicted_step_fits(
    wan: LoadedWan,
) -> None:
    engine = make(wan, step_budget_s=2.5)
    for rows in (1, 2):  # a denoise row of these latents costs 1 s, no fixed cost
        engine.costs.observe(StepSample("denoise", (1, 4, 2, 4, 4), rows, float(rows)))
    outs, emit = collect()
    for rid in ("a", "b", "c"):
        engine.add_request(video(rid), emit)
    engine.step()  # admits a and b (2 s), not c (3 s); runs their encode
    s = engine.stats()
    assert (s.num_running, s.num_waiting) == (2, 1)
    assert s.predicted_step_s == pytest.approx(2.0)
    progress = engine.progress("c")
    assert progress is not None and progress.status == "queued"
    drive(engine)  # measured ms-steps replace the 1 s fit: c joins, all finish
    assert [outs[r].finish_reason for r in "abc"] == ["done"] * 3


def test_one_request_runs_alone_over_the_budget_and_no_budget_admits_all(
    wan: LoadedWan,
) -> None:
    tight, unlimited = make(wan, step_budget_s=0.5), make(wan, step_budget_s=None)
    for engine in (tight, unlimited):
        engine.costs.observe(StepSample("denoise", (1, 4, 2, 4, 4), 1, 1.0))
        _, emit = collect()
        for rid in ("a", "b", "c"):
            engine.add_request(video(rid), emit)
        engine.step()
    assert (tight.stats().num_running, tight.stats().num_waiting) == (1, 2)
    assert (unlimited.stats().num_running, unlimited.stats().num_waiting) == (3, 0)
    with pytest.raises(ValueError, match="step_budget_s"):
        make(wan, step_budget_s=0.0)
