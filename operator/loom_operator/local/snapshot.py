"""The fleet as the controller last saw it, written to `status.json` for `loom status` (and
scripts) in other shells: workers, their versions and load, and the conditions.

Owns the snapshot's shape and JSON; never probes anything (the controller fills it in).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.autoscale import AUTOSCALING, AutoscalePlan, RoleDecision
from loom_operator.fleet.observed import WorkerState
from loom_operator.local.state import StateError, StatePaths, WorkerEntry, write_atomic
from loom_runtime.control_api.status import WorkerStatus

SCHEMA = "loom.dev/local-status"
STATUS_REFRESH_S = 5.0  # status.json is rewritten at least this often, else only on change


@dataclass(frozen=True)
class WorkerRow:
    name: str
    role: str
    address: str
    pid: int
    version: str
    """Weights version it serves ('' while unknown)."""
    state: str
    """serving | draining | paused | loading | failed | starting | exited | unknown"""
    ready: bool
    routed: bool
    in_flight: int
    restarts: int
    kv_free_blocks: int
    kv_blocks: int
    log: str


@dataclass(frozen=True)
class ConditionRow:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class WeightSyncRow:
    """Where the weight sync stands (the WeightSyncing condition, as data for scripts)."""

    active: bool
    phase: str
    """The condition's reason: InSync when idle, else the strategy (Rolling, Barrier) or what
    holds it up (CapacityGap, …; docs/fleet.md)."""
    target_version: str
    message: str


@dataclass(frozen=True)
class ScalingRow:
    """The planner's latest decision for one role (docs/autoscaling.md)."""

    role: str
    replicas: int
    """What the planner holds the role to now."""
    ready: int
    """Workers of the role serving now."""
    reason: str
    message: str


@dataclass(frozen=True)
class FleetStatus:
    deployment: str
    endpoint: str
    """The OpenAI base URL clients use."""
    target_version: str
    strategy: str
    controller_pid: int
    router_pid: int
    updated_at: float
    workers: tuple[WorkerRow, ...] = ()
    conditions: tuple[ConditionRow, ...] = ()
    stopped: bool = False
    weight_sync: WeightSyncRow | None = None
    scaling: tuple[ScalingRow, ...] = ()
    """One row per role the planner moves; empty without autoscaling."""

    def condition(self, type_: str) -> ConditionRow | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, **dataclasses.asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> FleetStatus:
        doc: dict[str, Any] = json.loads(text)
        if doc.pop("schema", None) != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document")
        doc["workers"] = tuple(WorkerRow(**w) for w in doc["workers"])
        doc["conditions"] = tuple(ConditionRow(**c) for c in doc["conditions"])
        sync = doc.get("weight_sync")
        doc["weight_sync"] = WeightSyncRow(**sync) if isinstance(sync, dict) else None
        doc["scaling"] = tuple(ScalingRow(**r) for r in doc.get("scaling", ()))
        return cls(**doc)


def worker_row(
    entry: WorkerEntry, state: WorkerState | None, status: WorkerStatus | None, log: str
) -> WorkerRow:
    """One row of the table from the process entry, the observation and the last Status."""
    if state is None or not state.alive:
        phase = "exited"
    elif not state.ready:
        phase = "starting" if state.last_seen is None else "unresponsive"
    else:
        phase = status.state if status is not None else "unknown"
    return WorkerRow(
        name=entry.name,
        role=entry.role,
        address=entry.address,
        pid=entry.pid,
        version=(state.weights_version if state else None) or "",
        state=phase,
        ready=bool(state and state.ready),
        routed=bool(state and state.routed),
        in_flight=state.in_flight if state else 0,
        restarts=entry.restarts,
        kv_free_blocks=status.num_free_blocks if status else 0,
        kv_blocks=status.num_blocks if status else 0,
        log=log,
    )


def scaling_rows(
    decisions: tuple[RoleDecision, ...], ready: dict[str, int]
) -> tuple[ScalingRow, ...]:
    return tuple(
        ScalingRow(d.role, d.desired, ready.get(d.role, 0), d.reason, d.message) for d in decisions
    )


def condition_rows(
    conditions: tuple[SetCondition, ...], plan: AutoscalePlan | None = None
) -> tuple[ConditionRow, ...]:
    """The fleet's conditions, and Autoscaling (the planner's summary) once it has decided."""
    rows = tuple(ConditionRow(c.type, c.status, c.reason, c.message) for c in conditions)
    return rows if plan is None else (*rows, ConditionRow(AUTOSCALING, "True", *plan.summary()))


def weight_sync_row(conditions: tuple[SetCondition, ...], target: str) -> WeightSyncRow | None:
    c = next((c for c in conditions if c.type == "WeightSyncing"), None)
    if c is None:
        return None
    return WeightSyncRow(c.status == "True", c.reason, target, c.message)


def save_status(paths: StatePaths, status: FleetStatus) -> None:
    write_atomic(paths.status, status.to_json())


def load_status(paths: StatePaths) -> FleetStatus | None:
    """The last snapshot, or None when no controller ever ran here."""
    try:
        text = paths.status.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return FleetStatus.from_json(text)
    except (ValueError, TypeError, KeyError) as e:
        raise StateError(f"{paths.status}: unreadable status: {e}") from e


def status_changed(written: FleetStatus | None, status: FleetStatus, now: float) -> bool:
    """Whether `status` must be written: it differs from what was (beyond its time), or what
    was is older than STATUS_REFRESH_S."""
    return (
        written is None
        or now - written.updated_at > STATUS_REFRESH_S
        or dataclasses.replace(written, updated_at=now) != status
    )
