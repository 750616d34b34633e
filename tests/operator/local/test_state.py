"""The state directory: the process table round-trips and refuses other files, secrets are made
once and kept private, one controller holds a fleet at a time, and the fleet is found by name."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from loom_operator.local.state import (
    ControllerLock,
    ProcessTable,
    RouterEntry,
    StateError,
    StatePaths,
    WorkerEntry,
    controller_running,
    find_state,
    load_or_create_secrets,
    load_processes,
    save_processes,
)


def entry(name: str, port: int = 9000, **kw: object) -> WorkerEntry:
    fields: dict[str, object] = dict(
        name=name, role="decode", pid=123, ident="42", started_at=1.0, http_port=port,
        control_port=port + 1, kv_events_port=port + 2, kv_replay_port=port + 3,
        kv_side_port=None, version="v1", source="loom://tiny",
    )  # fmt: skip
    fields.update(kw)
    return WorkerEntry(**fields)  # type: ignore[arg-type]


def test_process_table_round_trips_and_lists_every_port(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    table = ProcessTable().with_worker(entry("b", 9100, kv_side_port=9200, role="prefill"))
    table = table.with_worker(entry("a", 9000, restarts=2, last_exit_at=5.0))
    table = ProcessTable(table.workers, RouterEntry(7, None, 1.0, 8000, 8001))
    save_processes(paths, table)
    assert load_processes(paths) == table
    assert [w.name for w in table.workers] == ["a", "b"]
    assert table.ports() == {9000, 9001, 9002, 9003, 9100, 9101, 9102, 9103, 9200, 8000, 8001}
    assert table.without("a").get("a") is None


def test_a_replaced_worker_keeps_one_entry() -> None:
    table = ProcessTable().with_worker(entry("a")).with_worker(entry("a", pid=999))
    assert len(table.workers) == 1 and table.workers[0].pid == 999


def test_an_unknown_process_file_is_refused_with_its_path(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.processes.write_text('{"schema": "something-else"}')
    with pytest.raises(StateError, match=r"processes\.json"):
        load_processes(paths)
    assert load_processes(StatePaths(tmp_path / "new")) == ProcessTable()


def test_secrets_are_created_once_and_private(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    first = load_or_create_secrets(paths)
    assert load_or_create_secrets(paths) == first
    assert first.control_token != first.admin_token
    assert stat.S_IMODE(paths.secrets.stat().st_mode) == 0o600


def test_one_controller_holds_a_state_directory(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    assert not controller_running(paths)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(paths.lock)], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        assert controller_running(paths)
        with pytest.raises(StateError, match="another `loom up`"):
            ControllerLock(paths).acquire()
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert not controller_running(paths)  # the OS released the lock of the killed holder
    lock = ControllerLock(paths)
    lock.acquire()
    lock.release()


HOLD_LOCK = """
import fcntl, sys, time
f = open(sys.argv[1], "a+")
fcntl.flock(f.fileno(), fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


def test_the_fleet_is_found_by_name_or_as_the_only_one(tmp_path: Path) -> None:
    assert find_state(None, tmp_path / "x", tmp_path).root == tmp_path / "x"
    assert find_state("dep", None, tmp_path).root == tmp_path / "dep"
    with pytest.raises(StateError, match="no local fleet"):
        find_state(None, None, tmp_path)
    save_processes(StatePaths(tmp_path / "one"), ProcessTable())
    assert find_state(None, None, tmp_path).root == tmp_path / "one"
    save_processes(StatePaths(tmp_path / "two"), ProcessTable())
    with pytest.raises(StateError, match="one, two"):
        find_state(None, None, tmp_path)
