"""The persisted record survives JSON exactly, and a wrong file is refused with the field named."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.record import (
    FleetRecord,
    RecordError,
    Retirement,
    SyncRecord,
    WorkerHistory,
    WorkerProgress,
)

FULL = FleetRecord(
    sync=SyncRecord(
        target_version="v2",
        source_uri="hf://org/model@v2",
        strategy="Barrier",
        started_at=10.0,
        workers=(
            WorkerProgress(
                "w-1", "frozen", since=11.0, frozen_at=11.0, migrated_at=71.0, taken="safe"
            ),
            WorkerProgress("w-0", "failed", since=12.5, loads=1, reason="LoadTimeout: slow"),
        ),
        released_at=None,
        finished_at=None,
    ),
    failover=(
        WorkerHistory(
            "w-2",
            failures=(1.0, 3.0),
            failed_since=3.0,
            reason="exited",
            last_exit_at=3.0,
            last_restart_at=4.0,
        ),
    ),
    retiring=(Retirement("w-9", since=2.0, migrated_at=None),),
    conditions=(SetCondition("Degraded", "True", "WorkerFailed", "w-2 exited"),),
)


def test_round_trip_is_exact_and_text_is_stable() -> None:
    text = FULL.to_json()
    back = FleetRecord.from_json(text)
    assert back == FULL
    assert back.to_json() == text
    assert [w.name for w in back.sync.workers] == ["w-0", "w-1"]  # type: ignore[union-attr]
    assert json.loads(text)["version"] == 1


def test_empty_record_round_trips() -> None:
    assert FleetRecord.from_json(FleetRecord().to_json()) == FleetRecord()


def _doc(**record: object) -> str:
    return json.dumps({"schema": "loom.dev/fleet-record", "version": 1, "record": record})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ('{"schema": "other", "version": 1, "record": {}}', "not a fleet record"),
        ('{"schema": "loom.dev/fleet-record", "version": 2, "record": {}}', "version 2"),
        (_doc(extra=1), r"unknown field\(s\) \['extra'\]"),
        (_doc(failover=[{"name": "w", "failures": ["x"]}]), r"record.failover\[0\].failures\[0\]"),
        (_doc(failover=[{"failures": []}]), "missing field 'name'"),
        (
            _doc(
                sync={
                    "target_version": "v2",
                    "source_uri": "s",
                    "strategy": "Sideways",
                    "started_at": 0,
                }
            ),
            r"record.sync.strategy: 'Sideways' is not one of",
        ),
        (
            _doc(
                sync={
                    "target_version": "v2",
                    "source_uri": "s",
                    "strategy": "Rolling",
                    "started_at": 0,
                    "workers": [{"name": "a"}, {"name": "a"}],
                }
            ),
            "listed twice",
        ),
        (_doc(retiring=[{"name": "w", "since": True}]), r"record.retiring\[0\].since"),
    ],
)
def test_bad_records_are_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        FleetRecord.from_json(text)


times = st.floats(min_value=0, max_value=1e9, allow_nan=False)
progress = st.builds(
    WorkerProgress,
    name=st.text("abc-0123", min_size=1, max_size=8),
    step=st.sampled_from(["pending", "frozen", "drained", "loaded", "resumed", "failed"]),
    since=st.none() | times,
    frozen_at=st.none() | times,
    migrated_at=st.none() | times,
    loads=st.integers(0, 3),
    taken=st.sampled_from(["", "safe", "fallback", "gap", "barrier", "adopted"]),
    reason=st.text(max_size=20),
)


@given(workers=st.lists(progress, max_size=5, unique_by=lambda p: p.name), started=times)
def test_any_sync_record_round_trips(workers: list[WorkerProgress], started: float) -> None:
    record = FleetRecord(sync=SyncRecord("v9", "loom://tiny", "Rolling", started, tuple(workers)))
    assert FleetRecord.from_json(record.to_json()) == record
