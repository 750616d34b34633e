"""The state file: saved atomically, loaded back equal, a failed write keeps the old record."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.record import FleetRecord, RecordError, Retirement
from loom_operator.fleet.store import load_record, save_record

ONE = FleetRecord(retiring=(Retirement("w-3", since=4.0),))
TWO = FleetRecord(conditions=(SetCondition("Ready", "True", "AllReplicasReady", "ok"),))


def test_missing_file_is_an_empty_record(tmp_path: Path) -> None:
    assert load_record(tmp_path / "none.json") == FleetRecord()


def test_save_then_load_returns_the_record_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / "fleet.json"
    save_record(path, ONE)
    save_record(path, TWO)
    assert load_record(path) == TWO
    assert sorted(os.listdir(path.parent)) == ["fleet.json"]


def test_a_write_that_fails_before_the_rename_keeps_the_old_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fleet.json"
    save_record(path, ONE)

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save_record(path, TWO)
    monkeypatch.undo()
    assert load_record(path) == ONE
    assert sorted(os.listdir(tmp_path)) == ["fleet.json"]


def test_a_corrupt_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    path.write_text("{half a rec", encoding="utf-8")
    with pytest.raises(RecordError, match=r"fleet.json: fleet record is not JSON"):
        load_record(path)
