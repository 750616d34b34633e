"""Prefill leases: released once pulled or once expired, never while a read is in progress, and
kept alive by pins."""

from __future__ import annotations

import pytest

from loom_runtime.transfer.lease import LeaseTable, Released


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_completed_lease_is_released_once_as_pulled() -> None:
    clock = Clock()
    table = LeaseTable(30.0, clock)
    table.grant("r1", [3, 4], 20)
    assert table.take_released() == []
    assert table.complete("r1")
    assert table.take_released() == [Released("r1", (3, 4), expired=False)]
    assert table.take_released() == [] and len(table) == 0
    assert not table.complete("r1")  # a late notification is harmless


def test_an_unpulled_lease_expires_after_its_ttl() -> None:
    clock = Clock()
    table = LeaseTable(30.0, clock)
    table.grant("r1", [7], 5)
    clock.now += 29.9
    assert table.take_released() == []
    clock.now += 0.1
    assert table.take_released() == [Released("r1", (7,), expired=True)]
    assert table.pin("r1") is None


def test_a_pin_extends_the_lease_and_fails_once_it_is_gone() -> None:
    clock = Clock()
    table = LeaseTable(10.0, clock)
    table.grant("r1", [1], 5)
    clock.now += 9
    lease = table.pin("r1")
    assert lease is not None and lease.deadline == clock.now + 10
    clock.now += 9
    assert table.take_released() == []  # would have expired without the pin
    clock.now += 1
    assert table.pin("r1") is None  # expired: a decode must not start reading now
    assert table.take_released()[0].expired


def test_a_lease_under_a_read_never_expires_until_the_read_ends() -> None:
    clock = Clock()
    table = LeaseTable(10.0, clock)
    table.grant("r1", [1, 2], 20)
    assert table.begin_read("r1") is not None
    clock.now += 100
    assert table.take_released() == []
    table.end_read("r1", pulled=True)
    assert table.take_released() == [Released("r1", (1, 2), expired=False)]


def test_a_failed_read_leaves_the_lease_for_its_ttl() -> None:
    clock = Clock()
    table = LeaseTable(10.0, clock)
    table.grant("r1", [1], 5)
    assert table.begin_read("r1") is not None
    table.end_read("r1", pulled=False)
    assert table.take_released() == []
    clock.now += 10
    assert table.take_released()[0].expired


def test_grant_twice_and_bad_ttl_are_refused() -> None:
    table = LeaseTable(1.0)
    table.grant("r1", [1], 5)
    with pytest.raises(ValueError, match="already"):
        table.grant("r1", [2], 5)
    with pytest.raises(ValueError, match="ttl"):
        LeaseTable(0)
