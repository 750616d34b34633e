"""Table tests for each load and locality scorer: inputs → scores in [0, 1]."""

from __future__ import annotations

from typing import Any

import pytest

from loom_router.core.load import EngineMetrics, load_view
from loom_router.core.scorers import (
    in_flight,
    kv_cache_utilization,
    prefix,
    queue,
    running,
    session,
)
from loom_router.core.scorers.contract import Scorer, ScoringContext

IDS = ("a", "b", "c")


def ctx(
    metrics: dict[str, dict[str, Any]] | None = None,
    flights: dict[str, int] | None = None,
    blocks: dict[str, int] | None = None,
    total: int = 0,
    sticky: str | None = None,
) -> ScoringContext:
    fresh = {k: EngineMetrics(**v) for k, v in (metrics or {}).items()}
    return ScoringContext(IDS, load_view(fresh, flights), blocks or {}, total, sticky)


CASES: list[tuple[str, Scorer, ScoringContext, dict[str, float]]] = [
    # prefix: longest consecutive cached prefix / prompt blocks
    (
        "prefix ratio",
        prefix.score,
        ctx(blocks={"a": 4, "b": 2}, total=8),
        {"a": 0.5, "b": 0.25, "c": 0},
    ),
    ("prefix whole", prefix.score, ctx(blocks={"a": 8}, total=8), {"a": 1, "b": 0, "c": 0}),
    ("prefix over", prefix.score, ctx(blocks={"a": 9}, total=8), {"a": 1, "b": 0, "c": 0}),
    ("prefix none", prefix.score, ctx(blocks={"a": 3}, total=0), {"a": 0, "b": 0, "c": 0}),
    (
        "approx same",
        prefix.approximate_score,
        ctx(blocks={"b": 1}, total=4),
        {"a": 0, "b": 0.25, "c": 0},
    ),
    # queue: fewer waiting is better; unknown (stale) counts as the fleet mean, never idle
    (
        "queue",
        queue.score,
        ctx({"a": {"waiting": 0}, "b": {"waiting": 4}, "c": {"waiting": 2}}),
        {"a": 1, "b": 0, "c": 0.5},
    ),
    (
        "queue stale",
        queue.score,
        ctx({"a": {"waiting": 2}, "b": {"waiting": 6}}),
        {"a": 1, "b": 0, "c": 0.5},
    ),
    ("queue absent", queue.score, ctx({"a": {"running": 1}}), {"a": 0, "b": 0, "c": 0}),
    # running: same shape
    (
        "running",
        running.score,
        ctx({"a": {"running": 8}, "b": {"running": 0}, "c": {"running": 4}}),
        {"a": 0, "b": 1, "c": 0.5},
    ),
    # kv_cache_utilization: 1 − usage; unknown counts as the fleet mean usage
    (
        "kv",
        kv_cache_utilization.score,
        ctx({"a": {"kv_usage": 0.25}, "b": {"kv_usage": 1.0}}),
        {"a": 0.75, "b": 0, "c": 0.375},
    ),
    (
        "kv over",
        kv_cache_utilization.score,
        ctx({"a": {"kv_usage": 1.5}, "b": {"kv_usage": -0.5}}),
        {"a": 0, "b": 1, "c": 0.5},
    ),
    ("kv unknown", kv_cache_utilization.score, ctx(), {"a": 0, "b": 0, "c": 0}),
    # in-flight: the router's own count, always known (missing = 0 requests)
    ("in flight", in_flight.score, ctx(flights={"a": 4, "b": 2}), {"a": 0, "b": 0.5, "c": 1}),
    ("in flight idle", in_flight.score, ctx(), {"a": 1, "b": 1, "c": 1}),
    # session: 1 where the session went last
    ("session", session.score, ctx(sticky="b"), {"a": 0, "b": 1, "c": 0}),
    ("no session", session.score, ctx(), {"a": 0, "b": 0, "c": 0}),
]


@pytest.mark.parametrize(
    ("name", "scorer", "context", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_scorer_table(
    name: str, scorer: Scorer, context: ScoringContext, expected: dict[str, float]
) -> None:
    got = scorer(context)
    assert set(got) == set(IDS)
    assert all(0.0 <= v <= 1.0 for v in got.values())
    assert got == pytest.approx(expected)
