"""The fleet controller's persisted record: sync progress, restart history, retirements, conditions.

Owns the record's shape and its versioned JSON form; never decides anything and never does I/O.
A restarted controller that loads this record resumes exactly where the last one stopped.
"""

from __future__ import annotations

import dataclasses
import json
import types
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.desired import Strategy

SCHEMA = "loom.dev/fleet-record"
SCHEMA_VERSION = 1
MAX_FAILURES = 64  # failure times kept per worker (a bound, whatever the window)

SyncStep = Literal["pending", "frozen", "drained", "loaded", "resumed", "failed"]
"""pending: not started | frozen: Freeze sent, draining | drained: LoadWeights sent |
loaded: on the target version, Resume due | resumed: done | failed: see `reason`."""
HELD_STEPS: tuple[SyncStep, ...] = ("frozen", "drained", "loaded")
"""Steps in which the sync holds a worker out of routing."""

Taken = Literal["", "safe", "fallback", "gap", "barrier", "adopted", "keep"]
"""Why the sync took a worker out: a same-version pair stayed routable (safe), only decode
workers stayed (fallback), nothing could stay (gap, one worker per role), Barrier, or it was
found already out (adopted, e.g. after a controller restart from an older record)."""

FAILED_DIED = "Died"
FAILED_LOAD_TIMEOUT = "LoadTimeout"


class RecordError(ValueError):
    """A persisted record that cannot be read: bad JSON, another schema, or a wrong field."""


@dataclass(frozen=True)
class WorkerProgress:
    """One worker's place in a weight sync."""

    name: str
    step: SyncStep = "pending"
    since: float | None = None
    """When it entered `step`."""
    frozen_at: float | None = None
    """When its drain started (the drain timeout counts from here)."""
    migrated_at: float | None = None
    """When its remaining requests were migrated after the drain timeout."""
    loads: int = 0
    """LoadWeights sent to it for this sync's target (never more than one)."""
    taken: Taken = ""
    reason: str = ""
    """failed: `Died` or `LoadTimeout`, with details after a colon."""


@dataclass(frozen=True)
class SyncRecord:
    """Progress of one weight sync to `target_version`."""

    target_version: str
    source_uri: str
    strategy: Strategy
    started_at: float
    workers: tuple[WorkerProgress, ...] = ()
    released_at: float | None = None
    """Barrier: when every worker was loaded and the resume began."""
    finished_at: float | None = None
    """When every worker had resumed on the target version."""

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.workers, key=lambda w: w.name))
        if len({w.name for w in ordered}) != len(ordered):
            raise RecordError(f"sync to {self.target_version}: a worker is listed twice")
        object.__setattr__(self, "workers", ordered)

    @property
    def active(self) -> bool:
        return self.finished_at is None

    def get(self, name: str) -> WorkerProgress | None:
        return next((w for w in self.workers if w.name == name), None)

    def step(self, name: str) -> SyncStep | None:
        p = self.get(name)
        return p.step if p else None

    def held(self) -> tuple[WorkerProgress, ...]:
        """Workers the sync holds out of routing now."""
        return tuple(w for w in self.workers if w.step in HELD_STEPS)


@dataclass(frozen=True)
class WorkerHistory:
    """What failover remembers of one worker."""

    name: str
    failures: tuple[float, ...] = ()
    """When it failed, within the crash-loop window, oldest first (at most MAX_FAILURES)."""
    failed_since: float | None = None
    """Start of the failure it has not recovered from; None when healthy."""
    reason: str = ""
    """Why it failed last, for humans."""
    last_exit_at: float | None = None
    """The newest exit time seen (a newer one is a new failure)."""
    last_restart_at: float | None = None
    """When the last RestartWorker was sent."""


@dataclass(frozen=True)
class Retirement:
    """A worker beyond the desired replicas, draining before it is stopped."""

    name: str
    since: float
    migrated_at: float | None = None


@dataclass(frozen=True)
class FleetRecord:
    """Everything the controller must remember between reconciliations; nothing else."""

    sync: SyncRecord | None = None
    failover: tuple[WorkerHistory, ...] = ()
    retiring: tuple[Retirement, ...] = ()
    conditions: tuple[SetCondition, ...] = ()
    """The conditions last written (only changes are written again)."""

    def to_json(self) -> str:
        """The record as versioned JSON (stable key order, so equal records give equal text)."""
        doc = {"schema": SCHEMA, "version": SCHEMA_VERSION, "record": dataclasses.asdict(self)}
        return json.dumps(doc, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> FleetRecord:
        """Parse what `to_json` wrote. Raises RecordError naming the field that is wrong."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise RecordError(f"fleet record is not JSON: {e}") from e
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise RecordError(f"not a fleet record: expected schema {SCHEMA!r}")
        version = doc.get("version")
        if version != SCHEMA_VERSION:
            raise RecordError(
                f"fleet record version {version!r} is not {SCHEMA_VERSION}: it was written by "
                "another Loom; delete the state file to start over (a sync in flight restarts)"
            )
        record = _decode(cls, doc.get("record"), "record")
        assert isinstance(record, FleetRecord)
        return record


def _decode(tp: Any, value: Any, path: str) -> Any:
    """`value` (parsed JSON) as type `tp`, checked; RecordError names `path` when it is wrong."""
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _decode_dataclass(tp, value, path)
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in get_args(tp):
            return None
        inner = [a for a in get_args(tp) if a is not type(None)]
        return _decode(inner[0], value, path)
    if origin is tuple:
        if not isinstance(value, list):
            raise RecordError(f"{path}: expected a list, got {value!r}")
        item = get_args(tp)[0]
        return tuple(_decode(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is Literal:
        if value not in get_args(tp):
            raise RecordError(f"{path}: {value!r} is not one of {get_args(tp)}")
        return value
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str) and type(value) is tp:
        return value
    raise RecordError(f"{path}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def _decode_dataclass(cls: type, value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise RecordError(f"{path}: expected an object, got {value!r}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise RecordError(f"{path}: unknown field(s) {unknown}")
    kwargs = {}
    for name, f in fields.items():
        if name in value:
            kwargs[name] = _decode(hints[name], value[name], f"{path}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(f"{path}: missing field {name!r}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise RecordError(f"{path}: {e}") from e
