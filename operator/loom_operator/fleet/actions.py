"""The fleet controller's output: frozen action records a substrate shell carries out.

Owns the action vocabulary, its meaning and its order; never performs an action.
Every action is idempotent for the shell: applying one twice leaves the same state as once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loom_operator.api.roles import RoleName
from loom_runtime.card.conditions import ConditionStatus, ConditionType


@dataclass(frozen=True)
class RouteOff:
    """Router: stop sending the worker new requests (mark its endpoint down). First, always."""

    worker: str
    reason: str


@dataclass(frozen=True)
class Freeze:
    """Router: stop sending new requests (drain the endpoint); runtime: close admission
    (Pause WAIT, without blocking on the drain). Requests in flight finish."""

    worker: str


@dataclass(frozen=True)
class MigrateRequests:
    """Router: replay the worker's in-flight requests (prompt + tokens so far) on another worker
    of the same weights version. `abort`: then abort them on the worker (Pause ABORT), used when
    a drain ran past its timeout; a dead worker has nothing to abort."""

    worker: str
    abort: bool
    reason: str


@dataclass(frozen=True)
class StopWorker:
    """Substrate: stop and remove the worker (scale down). Its requests were drained or moved."""

    worker: str
    reason: str


@dataclass(frozen=True)
class RestartWorker:
    """Substrate: replace the failed worker by a fresh one loading `source` at `version` (the
    target version, so a worker that dies mid-sync comes back synced). Emitted once its backoff
    has passed; `attempt` counts failures in the crash-loop window, `backoff_s` is the wait used."""

    worker: str
    role: RoleName
    source: str
    version: str
    attempt: int
    backoff_s: float
    reason: str
    """Why the worker counts as failed (failover.worker_failure's words)."""


@dataclass(frozen=True)
class StartWorker:
    """Substrate: start a worker that does not exist yet, loading `source` at `version`."""

    worker: str
    role: RoleName
    source: str
    version: str


@dataclass(frozen=True)
class LoadWeights:
    """Runtime: load `source` as `version` into the frozen, drained worker; bumps its
    weights_version, clears its prefix cache and publishes AllBlocksCleared. It stays paused."""

    worker: str
    source: str
    version: str
    kv: str = ""
    """A push in mode keep: swap it in under the running requests (keep | recompute), the worker
    serving, not frozen."""


@dataclass(frozen=True)
class Resume:
    """Runtime: reopen admission; router: send it requests again (undrain, mark up)."""

    worker: str


@dataclass(frozen=True)
class RouteOn:
    """Router: send the (healthy, admitting) worker requests again (mark its endpoint up)."""

    worker: str


@dataclass(frozen=True)
class SetCondition:
    """Status: one condition of the DeploymentCard, written for humans."""

    type: ConditionType
    status: ConditionStatus
    reason: str
    message: str


WorkerAction = (
    RouteOff
    | Freeze
    | MigrateRequests
    | StopWorker
    | RestartWorker
    | StartWorker
    | LoadWeights
    | Resume
    | RouteOn
)
Action = WorkerAction | SetCondition

# The order a reconciliation lists its actions in: traffic away from trouble first, then
# drains, removals and replacements, then new weights, then traffic back, then status.
ACTION_ORDER: tuple[type, ...] = (
    RouteOff,
    Freeze,
    MigrateRequests,
    StopWorker,
    RestartWorker,
    StartWorker,
    LoadWeights,
    Resume,
    RouteOn,
    SetCondition,
)


def ordered(actions: Iterable[Action]) -> tuple[Action, ...]:
    """`actions` in ACTION_ORDER, by worker within a kind, each at most once (deterministic)."""
    unique = list(dict.fromkeys(actions))

    def key(a: Action) -> tuple[int, str]:
        return ACTION_ORDER.index(type(a)), getattr(a, "worker", "")

    return tuple(sorted(unique, key=key))


def takes_out(action: Action) -> str | None:
    """The worker `action` takes out of routing, or None."""
    if isinstance(action, RouteOff | Freeze | StopWorker | RestartWorker):
        return action.worker
    if isinstance(action, MigrateRequests) and action.abort:
        return action.worker
    return None


def brings_back(action: Action) -> str | None:
    """The worker `action` puts back into routing, or None."""
    return action.worker if isinstance(action, Resume | RouteOn) else None
