"""What the planner reads of a worker's /metrics: a real worker registry's exposition parsed into
TTFT and ITL histograms, the prefill backlog and the arrived prompt tokens (their rate: the
offered prefill load), quantiles as `histogram_quantile` computes
them, and a sliding window that forgets old requests and survives a worker's restart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loom_operator.control.role_metrics import (
    WorkerSample,
    counter_rate,
    increase,
    merge,
    parse_sample,
    quantile,
    read_arrived,
    read_generated,
    role_signals,
    window_p90,
)
from loom_operator.fleet.observed import WorkerState
from loom_runtime.control_api.status import WorkerStatus
from loom_runtime.engine.types import EngineStats, RequestMetrics
from loom_runtime.serve.metrics import ServerMetrics

STATS = EngineStats(
    1, 2, 0.5, 64, 32, 16, True, "v1", prefill_backlog_tokens=300, num_prompt_tokens=900,
    num_prompt_tokens_arrived=1200, num_generation_tokens=4000,
)  # fmt: skip


class Fixed:
    def stats(self) -> EngineStats:
        return STATS

    def in_flight(self) -> int:
        return 3


def finished(ttft: float, gaps: tuple[float, ...]) -> RequestMetrics:
    last = 10.0 + ttft + sum(gaps)
    return RequestMetrics(arrival_time=10.0, scheduled_time=10.0, first_token_time=10.0 + ttft,
                          last_token_time=last, finished_time=last,
                          inter_token_latencies=gaps)  # fmt: skip


def test_a_workers_exposition_gives_its_histograms_and_backlog() -> None:
    metrics = ServerMetrics("tiny", Fixed())
    for _ in range(9):
        metrics.observe_finished("stop", finished(0.03, (0.02, 0.02)))
    metrics.observe_finished("stop", finished(2.0, (0.3,)))
    sample = parse_sample(metrics.render().decode(), at=5.0)
    assert sample.prefill_backlog_tokens == 300 and sample.at == 5.0
    assert sample.prompt_tokens_arrived == 1200  # arrived, not the 900 scheduled
    assert sample.generation_tokens == 4000
    assert dict(sample.ttft)[0.04] == 9 and sample.ttft[-1] == (float("inf"), 10)
    assert dict(sample.itl)[0.025] == 18 and sample.itl[-1][1] == 19
    p90 = quantile(0.9, sample.ttft)
    assert p90 is not None and 0.02 < p90 <= 0.04  # 9 of 10 in (0.02, 0.04]


@pytest.mark.parametrize(
    ("buckets", "q", "expected"),
    [
        (((0.1, 0.0), (0.25, 100.0), (float("inf"), 100.0)), 0.9, 0.1 + 0.15 * 0.9),
        (((0.1, 50.0), (0.2, 100.0), (float("inf"), 100.0)), 0.5, 0.1),
        (((0.1, 0.0), (0.2, 0.0), (float("inf"), 10.0)), 0.9, 0.2),  # past the last bound
        (((0.1, 0.0), (float("inf"), 0.0)), 0.9, None),  # nothing observed
        ((), 0.9, None),
    ],
)
def test_quantile_interpolates_inside_its_bucket(
    buckets: tuple[tuple[float, float], ...], q: float, expected: float | None
) -> None:
    assert quantile(q, buckets) == pytest.approx(expected)


def test_increase_and_merge() -> None:
    old = ((0.1, 2.0), (float("inf"), 3.0))
    new = ((0.1, 5.0), (float("inf"), 9.0))
    assert increase(old, new) == ((0.1, 3.0), (float("inf"), 6.0))
    restarted = ((0.1, 1.0), (float("inf"), 1.0))
    assert increase(new, restarted) == restarted  # counters went down: all of it is new
    assert merge([old, new]) == ((0.1, 7.0), (float("inf"), 12.0))


def sample(at: float, slow: float, fast: float) -> WorkerSample:
    """A worker that has seen `slow` requests at 1 s and `fast` at 10 ms, ever."""
    ttft = ((0.01, fast), (1.0, fast + slow), (float("inf"), fast + slow))
    return WorkerSample(at, ttft, ttft, 0.0)


def test_the_window_sees_only_what_finished_inside_it() -> None:
    # 100 slow requests long ago, then only fast ones: the window's p90 is fast
    samples = {"w0": [sample(0.0, 0, 0), sample(10.0, 100, 0), sample(40.0, 100, 50),
                      sample(70.0, 100, 100)]}  # fmt: skip
    ttft, itl = window_p90(samples, now=70.0, window_s=30.0)
    assert ttft is not None and ttft <= 0.01 and itl == ttft
    ttft, _ = window_p90(samples, now=70.0, window_s=75.0)  # a window holding the slow ones
    assert ttft is not None and ttft > 0.5
    one = {"w0": [sample(70.0, 5, 5)]}
    assert window_p90(one, now=70.0, window_s=30.0) == (None, None)  # one scrape: no window


def test_a_restarted_worker_counts_from_its_restart_and_workers_add_up() -> None:
    before = sample(40.0, 0, 1000)
    after = replace(sample(70.0, 20, 0), at=70.0)  # restarted: its counters began again
    quick = [sample(40.0, 0, 0), sample(70.0, 0, 90)]
    ttft, _ = window_p90({"w0": [before, after], "w1": quick}, now=70.0, window_s=30.0)
    assert ttft is not None and 0.01 < ttft < 1.0  # 20 slow of 110 in the window: p90 among them


def status(in_flight: int, running: int, waiting: int, kv: float) -> WorkerStatus:
    return WorkerStatus("tiny", "decode", "v1", "serving", True, in_flight, running, waiting, kv,
                        64, 32, 16)  # fmt: skip


def test_a_roles_signals_come_from_its_own_workers() -> None:
    workers = [
        WorkerState("f-prefill-0", "prefill", "v1"),
        WorkerState("f-decode-0", "decode", "v1"),
        WorkerState("f-decode-1", "decode", "v1", ready=False),  # starting
    ]
    statuses = {
        "f-prefill-0": replace(status(9, 1, 8, 0.9), role="prefill"),
        "f-decode-0": status(6, 2, 0, 0.5),  # 4 wait for a KV pull or a slot to pull into
        "f-decode-1": None,
    }
    samples = {"f-prefill-0": [sample(0.0, 0, 0), WorkerSample(30.0, (), (), 700.0)]}
    decode = role_signals("decode", 2, workers, statuses, samples, 3, 30.0, 60, 10)
    assert (decode.replicas, decode.ready, decode.waiting, decode.kv_usage) == (2, 1, 7.0, 0.5)
    assert decode.sequences == 9.0  # 6 in flight on its worker and 3 held by the router
    assert decode.held == 0  # a decode worker serves: held requests are queue, not a cold start
    assert decode.prefill_tokens == 0 and decode.ttft_p90_s is None
    prefill = role_signals("prefill", 1, workers, statuses, samples, 3, 30.0, 60, 10)
    assert (prefill.ready, prefill.waiting, prefill.prefill_tokens) == (1, 8.0, 700.0)
    cold = role_signals("decode", 0, [], {}, {}, 2, 30.0, 60, 10)
    assert (cold.held, cold.waiting, cold.ready) == (2, 2.0, 0)
    assert cold.prompt_tokens_s is None and cold.sequences == 2.0


def arrived(at: float, tokens: float) -> WorkerSample:
    return WorkerSample(at, (), (), 0.0, tokens, generation_tokens=tokens / 10)


@pytest.mark.parametrize(
    ("what", "kept", "started_at", "rate"),
    [
        ("the count at the window's start against the newest",
         [arrived(0, 0), arrived(5, 1000), arrived(10, 3000), arrived(15, 9000)], 0.0, 800.0),
        ("a burst shows at once in a short window",
         [arrived(0, 0), arrived(5, 500), arrived(10, 1000), arrived(15, 40_500)], 0.0, 4000.0),
        ("a worker first seen inside the window: its oldest sample",
         [arrived(10, 1000), arrived(15, 2000)], 0.0, 200.0),
        ("a worker started inside the window counts from 0 at its start",
         [arrived(15, 2000)], 8.0, 200.0),
        ("one scrape of a worker older than the window says nothing",
         [arrived(15, 2000)], 0.0, None),
        ("a restarted worker counts from its restart",
         [arrived(5, 9000), arrived(15, 500)], 0.0, 50.0),
        ("no scrape", [], 0.0, None),
    ],
)  # fmt: skip
def test_the_arrival_rate_over_the_rate_window(
    what: str, kept: list[WorkerSample], started_at: float, rate: float | None
) -> None:
    assert counter_rate(kept, started_at, 15.0, 10.0, read_arrived) == rate
    generated = counter_rate(kept, started_at, 15.0, 10.0, read_generated)  # the same reading
    assert generated == (None if rate is None else pytest.approx(rate / 10))


def test_a_roles_offered_tokens_add_up_over_its_workers() -> None:
    workers = [WorkerState("p0", "prefill", "v1", started_at=0.0),
               WorkerState("p1", "prefill", "v1", started_at=12.0),  # new: counted from 0
               WorkerState("d0", "decode", "v1", started_at=0.0)]  # fmt: skip
    samples = {"p0": [arrived(5, 0), arrived(15, 5000)], "p1": [arrived(15, 1000)],
               "d0": [arrived(5, 0), arrived(15, 9000)]}  # fmt: skip
    prefill = role_signals("prefill", 2, workers, {}, samples, 0, 15.0, 30, 10)
    assert prefill.prompt_tokens_s == 600.0  # 500/s + 1000 tokens in its first 10 s window
    decode = role_signals("decode", 1, workers, {}, samples, 0, 15.0, 30, 10)
    assert decode.generated_tokens_s == 90.0 and decode.prompt_tokens_s == 900.0
