"""What /health and /ready report through an engine's life, and the control state rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom_runtime.control_api import control_pb2 as pb
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineStats
from loom_runtime.serve.app import EngineHealth
from loom_runtime.serve.control_service import watch_interval, worker_state


def test_health_and_readiness_follow_the_engine(tiny_v1: Path) -> None:
    engine = Engine.from_checkpoint(tiny_v1, EngineConfig(num_blocks=32, max_model_len=256))
    probe = EngineHealth(engine)
    assert not probe.healthy() and not probe.ready()  # built, step thread not started
    engine.start()
    try:
        assert probe.healthy() and probe.ready()
        assert engine.pause("wait", timeout=10)
        assert probe.healthy() and not probe.ready()  # alive but not admitting
        engine.resume()
        assert probe.ready()
    finally:
        engine.shutdown(timeout=10)
    assert not probe.healthy() and not probe.ready()


def _stats(admission_open: bool) -> EngineStats:
    return EngineStats(0, 0, 0.0, 8, 8, 16, admission_open, "v1")


STATES = [
    # (admission open, in flight, loading, healthy, state)
    (True, 3, False, True, pb.WORKER_STATE_SERVING),
    (False, 3, False, True, pb.WORKER_STATE_DRAINING),
    (False, 0, False, True, pb.WORKER_STATE_PAUSED),
    (False, 0, True, True, pb.WORKER_STATE_LOADING),
    (True, 0, False, False, pb.WORKER_STATE_FAILED),
    (False, 0, True, False, pb.WORKER_STATE_FAILED),
]


@pytest.mark.parametrize(("open_", "in_flight", "loading", "healthy", "state"), STATES)
def test_worker_state(
    open_: bool, in_flight: int, loading: bool, healthy: bool, state: int
) -> None:
    assert worker_state(_stats(open_), in_flight, loading, healthy) == state


def test_watch_interval_is_bounded() -> None:
    assert watch_interval(0) == 1.0
    assert watch_interval(0.001) == 0.05
    assert watch_interval(5) == 5
    assert watch_interval(10_000) == 60.0
