"""The engine's shell: abort at step boundaries, client disconnects, the step thread, pause /
resume, weight swaps and the requests it refuses. Every wait here is bounded."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, RequestOutput, SamplingParams
from loom_runtime.errors import AdmissionError, InvalidRequestError
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.tiny import init_tiny
from loom_runtime.wire.kv_events import AllBlocksCleared, EventBuffer

Prompt = Callable[[int, int], tuple[int, ...]]
Greedy = Callable[..., SamplingParams]

WAIT = 60.0  # seconds: generous bound for any wait on the step thread


def config(**kw: object) -> EngineConfig:
    base: dict[str, object] = {"max_model_len": 256, "num_blocks": 64, "idle_wait_s": 0.01}
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


def test_abort_mid_generation_frees_everything_at_the_next_step(
    tiny32: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = Engine(tiny32, config())
    outs: list[RequestOutput] = []
    engine.add_request(EngineRequest("a", prompt(40, 1), greedy(100)), outs.append)
    for _ in range(3):
        engine.step()
    assert engine.stats().num_free_blocks < engine.stats().num_blocks
    engine.abort("a")
    assert not outs[-1].finished  # takes effect at the step boundary, not inside abort()
    engine.step()
    final = outs[-1]
    assert final.finished and final.finish_reason == "abort" and final.num_output_tokens == 3
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_blocks and stats.num_requests_aborted == 1
    assert engine.in_flight() == 0 and not engine.step()


def test_aborting_a_queued_request_finishes_it_without_tokens(
    tiny32: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = Engine(tiny32, config())
    collector = OutputCollector(EngineRequest("q", prompt(5, 2), greedy(5)))
    engine.add_request(collector.req, collector)
    engine.abort("q")
    engine.abort("unknown-id")  # harmless
    engine.step()
    got = collector.result()
    assert got.finish_reason == "abort" and got.output_token_ids == ()


def test_a_client_callback_that_raises_aborts_its_request(
    tiny32: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = Engine(tiny32, config())
    seen: list[RequestOutput] = []

    def disconnected(out: RequestOutput) -> None:
        seen.append(out)
        if len(seen) == 2:
            raise ConnectionResetError("client went away")

    engine.add_request(EngineRequest("c", prompt(10, 3), greedy(50)), disconnected)
    for _ in range(5):
        engine.step()
    assert seen[-1].finished and seen[-1].finish_reason == "abort" and len(seen) == 3
    assert engine.in_flight() == 0
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_the_step_thread_serves_concurrent_callers_and_shuts_down(
    tiny64: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    # float64: arrival order changes batch composition, which must not change a greedy token
    reqs = [EngineRequest(f"t{i}", prompt(8 + 9 * i, 20 + i), greedy(6 + i)) for i in range(8)]
    inline = Engine(tiny64, config(dtype=torch.float64))
    expected = {r.request_id: OutputCollector(r) for r in reqs}
    for r in reqs:
        inline.add_request(r, expected[r.request_id])
    while inline.step():
        pass
    engine = Engine(tiny64, config(dtype=torch.float64))
    engine.start()
    engine.start()  # idempotent
    collectors = {r.request_id: OutputCollector(r) for r in reqs}

    def submit(batch: list[EngineRequest]) -> None:
        for r in batch:
            engine.add_request(r, collectors[r.request_id])

    threads = [threading.Thread(target=submit, args=(reqs[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    for c in collectors.values():
        assert c.done.wait(WAIT)
    for rid, c in collectors.items():
        assert c.result().output_token_ids == expected[rid].result().output_token_ids
        assert len(c.outputs) > 2  # streamed, not delivered at once
    step_threads = [t for t in threading.enumerate() if t.name == "loom-engine-loom"]
    assert len(step_threads) == 1 and step_threads[0].daemon
    engine.shutdown(timeout=WAIT)
    assert not engine.step_thread_alive()
    with pytest.raises(AdmissionError, match="shut down"):
        engine.add_request(EngineRequest("late", (1, 2), greedy(2)), lambda out: None)
    with pytest.raises(AdmissionError):
        engine.resume()


def test_shutdown_aborts_what_is_in_flight(
    tiny32: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = Engine(tiny32, config())
    collector = OutputCollector(EngineRequest("s", prompt(10, 4), greedy(200)))
    engine.add_request(collector.req, collector)
    engine.start()
    engine.shutdown(timeout=WAIT)
    assert collector.done.is_set() and collector.result().finish_reason == "abort"
    assert engine.in_flight() == 0


def test_pause_wait_drains_then_refuses_until_resume(
    tiny32: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = Engine(tiny32, config())
    engine.start()
    try:
        collector = OutputCollector(EngineRequest("w", prompt(10, 5), greedy(30)))
        engine.add_request(collector.req, collector)
        assert engine.pause("wait", timeout=WAIT)
        assert collector.done.is_set() and collector.result().finish_reason == "length"
        assert engine.in_flight() == 0 and not engine.stats().admission_open
        drained = engine.stats()
        assert drained.drains == 1 and drained.drain_seconds == drained.last_drain_seconds > 0
        with pytest.raises(AdmissionError, match="paused"):
            engine.add_request(EngineRequest("x", (1, 2), greedy(2)), lambda out: None)
        engine.resume()
        assert engine.stats().admission_open
        assert engine.generate(prompt(4, 6), greedy(3)).finish_reason == "length"
    finally:
        engine.shutdown(timeout=WAIT)


def test_pause_wait_times_out_and_pause_abort_empties(
    tiny32: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = Engine(tiny32, config())
    collectors = [
        OutputCollector(EngineRequest(f"p{i}", prompt(10, i), greedy(100))) for i in range(3)
    ]
    for c in collectors:
        engine.add_request(c.req, c)
    engine.step()
    assert engine.pause("wait", timeout=0.0) is False
    assert engine.in_flight() == 3
    assert engine.pause("abort", timeout=WAIT) is True
    assert engine.in_flight() == 0
    assert [c.result().finish_reason for c in collectors] == ["abort"] * 3


def test_load_weights_swaps_at_a_drained_boundary_and_clears_the_prefix_cache(
    tiny_dir: Path, tmp_path: Path, prompt: Prompt, greedy: Greedy
) -> None:
    other = init_tiny(tmp_path / "seed1", seed=1)
    events = EventBuffer()
    engine = Engine(load_model(tiny_dir), config(), events=events)  # its own copy of the weights
    p = prompt(40, 7)
    v1 = engine.generate(p, greedy(8))
    with pytest.raises(AdmissionError, match="pause"):
        engine.load_weights(str(other), "v2")  # admission still open
    collector = OutputCollector(EngineRequest("busy", p, greedy(8)))
    engine.add_request(collector.req, collector)
    assert engine.pause("wait", timeout=0.0) is False
    with pytest.raises(AdmissionError, match="1 in flight"):
        engine.load_weights(str(other), "v2")
    assert engine.pause("wait", timeout=WAIT)
    assert collector.result().num_cached_tokens == 32  # the prefix cache was warm
    events.take()
    engine.load_weights(str(other), "v2")
    assert engine.weights_version == "v2" and engine.stats().weights_version == "v2"
    assert any(isinstance(e, AllBlocksCleared) for e in events.take())
    engine.resume()
    v2 = engine.generate(p, greedy(8))
    assert v2.weights_version == "v2" and v2.num_cached_tokens == 0
    fresh = Engine(load_model(other), config()).generate(p, greedy(8))
    assert v2.output_token_ids == fresh.output_token_ids != v1.output_token_ids


@pytest.mark.parametrize(
    ("prompt_len", "max_tokens", "param"),
    [(0, 4, "prompt"), (256, 1, "prompt"), (200, 57, "max_tokens")],
)
def test_requests_that_cannot_fit_are_refused_before_queueing(
    tiny32: LoadedModel, greedy: Greedy, prompt_len: int, max_tokens: int, param: str
) -> None:
    engine = Engine(tiny32, config())
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(EngineRequest("r", (5,) * prompt_len, greedy(max_tokens)), print)
    assert err.value.param == param and engine.in_flight() == 0


def test_a_duplicate_request_id_is_refused(tiny32: LoadedModel, greedy: Greedy) -> None:
    engine = Engine(tiny32, config())
    engine.add_request(EngineRequest("dup", (5, 6), greedy(2)), lambda out: None)
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(EngineRequest("dup", (5, 6), greedy(2)), lambda out: None)
    assert err.value.param == "request_id" and engine.in_flight() == 1


def test_stats_show_running_waiting_and_usage(
    tiny32: LoadedModel, prompt: Prompt, greedy: Greedy
) -> None:
    engine = Engine(tiny32, config(max_num_seqs=2))
    for i in range(3):
        engine.add_request(EngineRequest(f"s{i}", prompt(20, i), greedy(5)), lambda out: None)
    assert engine.stats().num_waiting == 3 and engine.stats().num_running == 0
    engine.step()
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting) == (2, 1)
    assert stats.kv_usage == pytest.approx(4 / 64) and stats.num_prompt_tokens == 40
    assert stats.num_generation_tokens == 2 and stats.num_tokens_computed == 40


def test_a_model_of_another_dtype_is_refused(tiny32: LoadedModel) -> None:
    with pytest.raises(ValueError, match="dtype"):
        Engine(tiny32, config(dtype=torch.float64))


def test_the_queue_is_bounded(tiny32: LoadedModel, greedy: Greedy) -> None:
    engine = Engine(tiny32, config(max_num_seqs=1, max_waiting=1))
    for rid in ("a", "b"):
        engine.add_request(EngineRequest(rid, (5, 6), greedy(2)), lambda out: None)
    with pytest.raises(AdmissionError, match="limit 2"):
        engine.add_request(EngineRequest("c", (5, 6), greedy(2)), lambda out: None)
    assert engine.pause("abort", timeout=WAIT) and engine.in_flight() == 0
