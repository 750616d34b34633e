from __future__ import annotations

import pytest

from loom_router.core.load import EngineMetrics, LoadTracker, load_view, parse_metrics
from loom_router.errors import MetricsParseError
from loom_runtime.engine.types import EngineStats
from loom_runtime.serve.metrics import ServerMetrics


class _Stats:
    """The engine side of /metrics, as the worker renders it (the real ServerMetrics)."""

    def __init__(self, stats: EngineStats) -> None:
        self._stats = stats

    def stats(self) -> EngineStats:
        return self._stats

    def in_flight(self) -> int:
        return 0


def engine_exposition(**overrides: object) -> str:
    values: dict[str, object] = dict(
        num_running=3,
        num_waiting=5,
        kv_usage=0.25,
        num_blocks=10,
        num_free_blocks=2,
        block_size=16,
        admission_open=True,
        weights_version="v7",
    )
    values.update(overrides)
    stats = EngineStats(**values)  # type: ignore[arg-type]
    return ServerMetrics("tiny", _Stats(stats)).render().decode()


def test_parses_what_the_loom_worker_exposes() -> None:
    assert parse_metrics(engine_exposition()) == EngineMetrics(
        waiting=5, running=3, kv_usage=0.25, weights_version="v7", admission_open=True
    )


def test_admission_closed_is_read_as_closed() -> None:
    assert parse_metrics(engine_exposition(admission_open=False)).admission_open is False


def test_a_vllm_server_without_loom_metrics_leaves_them_unknown() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="m",engine="0"} 2\n'
        'vllm:num_requests_waiting{model_name="m",engine="1"} 3\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.2\n'
        'vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.6\n'
    )
    m = parse_metrics(text)
    assert m.waiting == 5  # engines of one server add up
    assert m.kv_usage == pytest.approx(0.4)  # and their usage averages
    assert (m.running, m.weights_version, m.admission_open) == (None, None, None)


def test_empty_scrape_is_all_unknown_not_zero() -> None:
    assert parse_metrics("") == EngineMetrics()


def test_garbage_is_a_typed_error() -> None:
    with pytest.raises(MetricsParseError):
        parse_metrics('vllm:num_requests_waiting{model_name="m" 1\n')


@pytest.mark.parametrize(
    ("scraped_at", "now", "fresh"),
    [
        (10.0, 10.0, True),
        (10.0, 11.99, True),
        (10.0, 12.0, True),  # exactly at the limit still counts
        (10.0, 12.01, False),
        (10.0, 100.0, False),
    ],
)
def test_scrapes_go_stale_after_two_seconds(scraped_at: float, now: float, fresh: bool) -> None:
    tracker = LoadTracker()
    tracker.record_scrape("d1", EngineMetrics(waiting=0, running=0), scraped_at)
    view = tracker.view(now)
    assert (view.metrics("d1") is not None) is fresh


def test_stale_load_is_unknown_never_zero() -> None:
    tracker = LoadTracker(stale_after_s=2.0)
    tracker.record_scrape("d1", EngineMetrics(waiting=9, running=9), at=0.0)
    tracker.begin("d1")
    view = tracker.view(now=5.0)
    assert view.metrics("d1") is None
    assert view.load("d1") == 1.0  # only what the router itself knows


def test_failed_scrape_forgets_the_last_value() -> None:
    tracker = LoadTracker()
    tracker.record_scrape("d1", EngineMetrics(waiting=1), at=1.0)
    tracker.record_scrape_failure("d1")
    assert tracker.view(1.0).metrics("d1") is None


def test_a_late_older_scrape_never_replaces_a_newer_one() -> None:
    tracker = LoadTracker()
    tracker.record_scrape("d1", EngineMetrics(waiting=1), at=5.0)
    tracker.record_scrape("d1", EngineMetrics(waiting=99), at=4.0)
    m = tracker.view(5.0).metrics("d1")
    assert m is not None and m.waiting == 1


def test_in_flight_counts_up_and_down_never_below_zero() -> None:
    tracker = LoadTracker()
    for _ in range(3):
        tracker.begin("d1")
    tracker.end("d1")
    assert tracker.view(0).in_flight_of("d1") == 2
    for _ in range(5):
        tracker.end("d1")
    assert tracker.view(0).in_flight_of("d1") == 0
    tracker.begin("d1")
    assert tracker.view(0).in_flight_of("d1") == 1


def test_forget_drops_scrapes_and_counts() -> None:
    tracker = LoadTracker()
    tracker.record_scrape("d1", EngineMetrics(waiting=1), at=0.0)
    tracker.begin("d1")
    tracker.forget(["d1"])
    view = tracker.view(0.0)
    assert view.metrics("d1") is None and view.in_flight_of("d1") == 0


@pytest.mark.parametrize(
    ("metrics", "in_flight", "expected"),
    [
        (None, 0, 0.0),
        (None, 4, 4.0),
        (EngineMetrics(running=3, waiting=2), 1, 5.0),  # other routers' requests show here
        (EngineMetrics(running=1, waiting=0), 4, 4.0),  # ours not yet visible in the scrape
        (EngineMetrics(kv_usage=0.5), 2, 2.0),  # no request counts scraped
    ],
)
def test_load_is_the_larger_of_own_and_scraped_counts(
    metrics: EngineMetrics | None, in_flight: int, expected: float
) -> None:
    view = load_view({"d1": metrics} if metrics else {}, {"d1": in_flight})
    assert view.load("d1") == expected


def test_view_is_a_frozen_copy() -> None:
    tracker = LoadTracker()
    tracker.begin("d1")
    view = tracker.view(0.0)
    tracker.begin("d1")
    assert view.in_flight_of("d1") == 1
    with pytest.raises(TypeError):
        view.in_flight["d1"] = 5  # type: ignore[index]
