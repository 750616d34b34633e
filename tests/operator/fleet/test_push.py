"""The rules of a trainer's push, as plain data: when one may open (one at a time, no sync in
motion, a new version, every worker ready), what the fleet serves once it is staged everywhere,
and when its swap is done."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.push import PushUpdate, pushed_desired, refuse_push, swap_done
from loom_operator.fleet.record import SyncRecord

FleetFactory = WorkerFactory = Any  # the conftest's builders

PUSH = PushUpdate("u1", "v3", "barrier", ("dep-prefill-0", "dep-decode-0"), "127.0.0.1", 1, 5.0,
                  "v2")  # fmt: skip


def observe(worker: WorkerFactory, **decode: object) -> FleetObservation:
    version = decode.pop("weights_version", "v2")
    return FleetObservation(
        (worker("prefill", 0, "v2"), worker("decode", 0, version, **decode)), now=10.0
    )


@pytest.mark.parametrize(
    ("decode", "current", "sync", "version", "mode", "refusal"),
    [
        ({}, None, None, "v3", "barrier", None),
        ({}, None, None, "v3", "rolling", None),
        ({}, None, None, "v3", "sideways", "mode must be one of barrier, rolling, keep"),
        ({}, None, None, "v3", "keep", None),  # a P/D fleet takes keep too (remote.py)
        ({}, None, None, "", "barrier", "a push needs a version"),
        ({}, None, None, "v2", "barrier", "already has weights version 'v2'"),
        ({}, PUSH, None, "v4", "barrier", "push u1 of v3 is still receiving"),
        ({}, replace(PUSH, state="swapping"), None, "v4", "barrier", "still swapping"),
        ({}, replace(PUSH, state="failed"), None, "v4", "barrier", None),
        ({}, replace(PUSH, state="done"), None, "v4", "barrier", None),
        ({}, None, SyncRecord("v2", "file:///m", "Rolling", 0.0, ()), "v3", "barrier",
         "a weight sync to v2 is in progress"),
        ({"ready": False}, None, None, "v3", "barrier",
         "not ready: dep-decode-0 (not running or not answering)"),
        ({"alive": False}, None, None, "v3", "barrier", "not ready: dep-decode-0"),
        ({"admission_open": False}, None, None, "v3", "barrier",
         "not ready: dep-decode-0 (starting, paused or draining)"),
        ({"routed": False}, None, None, "v3", "barrier", "not ready: dep-decode-0"),
        ({"weights_version": None}, None, None, "v3", "barrier", "not ready: dep-decode-0"),
    ],
)  # fmt: skip
def test_a_push_opens_only_on_a_ready_fleet_with_nothing_else_in_motion(
    fleet: FleetFactory,
    worker: WorkerFactory,
    decode: dict[str, object],
    current: PushUpdate | None,
    sync: SyncRecord | None,
    version: str,
    mode: str,
    refusal: str | None,
) -> None:
    kv = "keep" if mode == "keep" else ""
    why = refuse_push(
        fleet(version="v2"), observe(worker, **decode), sync, current, version, mode, kv
    )
    if refusal is None:
        assert why is None
    else:
        assert why is not None and refusal in why


@pytest.mark.parametrize(
    ("mode", "kv", "refusal"),
    [
        ("keep", "keep", None),
        ("keep", "recompute", None),
        ("keep", "drop", "kv must be one of keep, recompute for mode keep, got 'drop'"),
        ("keep", "", "kv must be one of keep, recompute"),
        ("barrier", "recompute", "kv is mode keep's option; mode barrier drains"),
        ("rolling", "", None),
    ],
)
def test_a_keep_push_takes_its_kv_option_on_an_aggregated_fleet(
    fleet: FleetFactory, worker: WorkerFactory, mode: str, kv: str, refusal: str | None
) -> None:
    desired = fleet({"aggregated": 2}, version="v2")
    observed = FleetObservation(
        (worker("aggregated", 0, "v2"), worker("aggregated", 1, "v2")), now=10.0
    )
    why = refuse_push(desired, observed, None, None, "v3", mode, kv)
    if refusal is None:
        assert why is None
    else:
        assert why is not None and refusal in why


def test_a_missing_worker_is_named_not_ready(fleet: FleetFactory, worker: WorkerFactory) -> None:
    observed = FleetObservation((worker("prefill", 0, "v2"),), now=10.0)
    why = refuse_push(fleet(version="v2"), observed, None, None, "v3", "barrier")
    assert why is not None and "dep-decode-0 (not running or not answering)" in why


@pytest.mark.parametrize(
    ("state", "card_version", "serves", "strategy"),
    [
        ("receiving", "v2", "v2", "Rolling"),  # not staged everywhere yet: nothing changes
        ("failed", "v2", "v2", "Rolling"),
        ("swapping", "v2", "v3", "Barrier"),
        ("done", "v2", "v3", "Barrier"),
        ("done", "v5", "v5", "Rolling"),  # the card moved on since the push opened: it wins
    ],
)
def test_the_fleet_serves_a_push_once_staged_until_the_card_moves(
    fleet: FleetFactory, state: str, card_version: str, serves: str, strategy: str
) -> None:
    desired = pushed_desired(fleet(version=card_version), replace(PUSH, state=state))  # type: ignore[arg-type]
    assert (desired.weights_version, desired.sync.strategy) == (serves, strategy)
    if serves == "v3":
        assert desired.source_uri == "push://u1"
    rolling = pushed_desired(fleet(version="v2"), replace(PUSH, state="done", mode="rolling"))
    assert rolling.sync.strategy == "Rolling"
    keep = replace(PUSH, state="swapping", mode="keep", kv="recompute")
    kept = pushed_desired(fleet(version="v2"), keep)
    assert (kept.sync.strategy, kept.sync.kv) == ("Keep", "recompute")


def test_a_swap_is_done_when_every_worker_serves_the_push_and_no_sync_is_active(
    fleet: FleetFactory, worker: WorkerFactory
) -> None:
    desired = fleet(version="v3")
    both = FleetObservation((worker("prefill", 0, "v3"), worker("decode", 0, "v3")), now=1.0)
    half = FleetObservation((worker("prefill", 0, "v3"), worker("decode", 0, "v2")), now=1.0)
    held = FleetObservation(
        (worker("prefill", 0, "v3"), worker("decode", 0, "v3", routed=False)), now=1.0
    )
    active = SyncRecord("v3", "push://u1", "Barrier", 0.0, ())
    assert swap_done(desired, both, None)
    assert swap_done(desired, both, replace(active, finished_at=2.0))
    assert not swap_done(desired, both, active)
    assert not swap_done(desired, half, None)
    assert not swap_done(desired, held, None)


def test_a_push_persists_and_reads_back_the_same() -> None:
    done = replace(PUSH, state="done", staged=frozenset(PUSH.workers))
    assert PushUpdate.from_json(done.as_json()) == done
    kept = replace(done, mode="keep", kv="recompute")
    assert PushUpdate.from_json(kept.as_json()) == kept
    with pytest.raises(ValueError, match="mode 'sideways'"):
        PushUpdate.from_json(dict(done.as_json(), mode="sideways"))
    with pytest.raises(ValueError, match="no 'base_version'"):
        PushUpdate.from_json({k: v for k, v in done.as_json().items() if k != "base_version"})
