"""What `loom up` says about a weight sync (finding 5): a condition line per change of status or
reason (not per message update), the router's held requests read from its /metrics, each
worker's version in the process table after a load, and the sync phase in `status.json`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

from loom_operator.control.router_admin import held_from_metrics
from loom_operator.fleet.actions import SetCondition
from loom_operator.local.events import FleetEvent
from loom_operator.local.executor import Executor
from loom_operator.local.launch import LaunchOptions
from loom_operator.local.snapshot import FleetStatus, weight_sync_row
from loom_operator.local.state import ProcessTable, Secrets, StatePaths, WorkerEntry, load_processes
from loom_operator.local.workers import ProcessSet

ENTRY = WorkerEntry(
    name="w", role="decode", pid=1, ident=None, started_at=100.0, http_port=9000,
    control_port=9001, kv_events_port=9002, kv_replay_port=9003, kv_side_port=None,
    version="v1", source="loom://tiny", restarts=0, last_exit_at=None,
)  # fmt: skip


def test_a_condition_is_printed_once_per_status_or_reason_change() -> None:
    events: list[FleetEvent] = []
    executor = Executor(None, None, None, events.append)  # type: ignore[arg-type]
    holding = [
        SetCondition("Ready", "False", "WeightSyncHolding", f"the router holds {n} request(s)")
        for n in (0, 1, 2, 3, 2, 1)
    ]
    done = SetCondition("Ready", "True", "AllReplicasReady", "every worker serves v2")
    for action in (*holding, done):
        asyncio.run(executor.execute((action,), None))  # type: ignore[arg-type]
    lines = [e.message for e in events if e.kind == "condition"]
    assert lines == [
        "Ready False (WeightSyncHolding): the router holds 0 request(s)",
        "Ready True (AllReplicasReady): every worker serves v2",
    ]


def test_held_requests_are_read_from_the_routers_metrics() -> None:
    text = (
        "# HELP loom_router:held_requests Requests held\n"
        "# TYPE loom_router:held_requests gauge\n"
        "loom_router:held_requests 3.0\n"
        'loom_router:requests_total{route="completions",code="200"} 7.0\n'
    )
    assert held_from_metrics(text) == 3
    assert held_from_metrics("loom_router:requests_total 1.0\n") == 0


def test_a_load_updates_the_workers_version_in_the_process_table(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    processes = ProcessSet(paths, Secrets("c", "a"), LaunchOptions(), {})
    processes._save(ProcessTable(workers=(ENTRY,)))  # as start_worker leaves it
    processes.record_version("w", "v2")
    assert load_processes(paths).get("w").version == "v2"  # type: ignore[union-attr]


def _status(**more: Any) -> FleetStatus:
    return FleetStatus(
        deployment="d", endpoint="http://127.0.0.1:8000/v1", target_version="v2",
        strategy="Rolling", controller_pid=1, router_pid=2, updated_at=0.0, **more,
    )  # fmt: skip


def test_status_json_has_the_sync_phase() -> None:
    conditions = (SetCondition("WeightSyncing", "True", "Rolling", "loading w"),)
    status = _status(weight_sync=weight_sync_row(conditions, "v2"))
    doc = json.loads(status.to_json())
    assert doc["weight_sync"] == {
        "active": True, "phase": "Rolling", "target_version": "v2", "message": "loading w",
    }  # fmt: skip
    assert FleetStatus.from_json(status.to_json()) == status
    old = json.loads(_status().to_json())
    del old["weight_sync"]  # a status.json written before the field existed
    assert FleetStatus.from_json(json.dumps(old)).weight_sync is None
    assert dataclasses.replace(status, weight_sync=None) == _status()
