"""What /health and /ready report through an engine's life, and the watch interval's bounds."""

from __future__ import annotations

from pathlib import Path

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.serve.app import EngineHealth
from loom_runtime.serve.control_service import watch_interval


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


def test_watch_interval_is_bounded() -> None:
    assert watch_interval(0) == 1.0
    assert watch_interval(0.001) == 0.05
    assert watch_interval(5) == 5
    assert watch_interval(10_000) == 60.0
