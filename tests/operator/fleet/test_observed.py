"""Worker observations and the coverage rule: what a set of routable workers can serve."""

from __future__ import annotations

from typing import Any

import pytest

from loom_operator.fleet.observed import Coverage, FleetObservation, WorkerState, coverage


def _w(role: str, version: str | None, i: int = 0) -> WorkerState:
    return WorkerState(name=f"{role}-{i}", role=role, weights_version=version)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("workers", "disaggregated", "expected"),
    [
        ([], True, Coverage.NONE),
        ([_w("prefill", "v1")], True, Coverage.NONE),
        ([_w("prefill", "v1"), _w("decode", "v1")], True, Coverage.PAIRED),
        ([_w("prefill", "v2"), _w("decode", "v1")], True, Coverage.FALLBACK),
        ([_w("prefill", "v2"), _w("decode", "v1"), _w("decode", "v2", 1)], True, Coverage.PAIRED),
        ([_w("decode", "v1")], True, Coverage.FALLBACK),
        ([_w("prefill", None), _w("decode", None)], True, Coverage.FALLBACK),
        ([_w("aggregated", "v1")], False, Coverage.PAIRED),
        ([_w("decode", "v3")], False, Coverage.PAIRED),
    ],
)
def test_coverage_pairs_prefill_and_decode_only_within_a_version(
    workers: list[WorkerState], disaggregated: bool, expected: Coverage
) -> None:
    assert coverage(workers, disaggregated) == expected


def test_coverage_levels_compare_worst_first() -> None:
    assert Coverage.NONE < Coverage.FALLBACK < Coverage.PAIRED


@pytest.mark.parametrize(
    ("fields", "routable", "frozen", "draining", "busy"),
    [
        ({}, True, False, False, 0),
        ({"routed": False}, False, False, False, 0),
        ({"admission_open": False, "routed": False, "in_flight": 2}, False, True, True, 2),
        ({"admission_open": False, "routed": False, "pending_kv_pulls": 1}, False, True, True, 1),
        ({"admission_open": False, "routed": False}, False, True, False, 0),
        ({"ready": False}, False, False, False, 0),
        ({"alive": False, "ready": False}, False, False, False, 0),
    ],
)
def test_worker_state_flags(
    fields: dict[str, Any], routable: bool, frozen: bool, draining: bool, busy: int
) -> None:
    w = WorkerState(name="w", role="decode", weights_version="v1", **fields)
    assert (w.routable, w.frozen, w.draining, w.busy) == (routable, frozen, draining, busy)


def test_observation_is_sorted_and_rejects_duplicate_names() -> None:
    obs = FleetObservation((_w("decode", "v1", 1), _w("decode", "v1", 0)), now=5.0)
    assert [w.name for w in obs.workers] == ["decode-0", "decode-1"]
    assert obs.get("decode-1") is not None and obs.get("nope") is None
    with pytest.raises(ValueError, match="unique"):
        FleetObservation((_w("decode", "v1"), _w("decode", "v2")), now=0.0)
