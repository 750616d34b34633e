"""DeploymentCard status, written by the operator: phase, conditions, roles, weight sync.

Owns the status shape; never decides a phase or condition (the fleet controller does).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from loom_operator.api.roles import RoleName
from loom_runtime.card.base import CardModel, list_map
from loom_runtime.card.conditions import Condition, ConditionType

Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "WeightSyncing", "Invalid", "Failed"]
SyncPhase = Literal["Idle", "Syncing", "Done", "Failed"]
WorkerStep = Literal[
    "Waiting", "Freezing", "Draining", "Transferring", "Bumping", "Resuming", "Done", "Failed"
]


DeploymentConditionType = Literal[ConditionType, "Autoscaling"]
"""Every card's condition types, and `Autoscaling`: True while Loom's planner moves the card's
roles, its reason the planner's latest (docs/autoscaling.md)."""


class DeploymentCondition(Condition):
    """A DeploymentCard condition: the cards' vocabulary plus `Autoscaling`."""

    type: DeploymentConditionType  # type: ignore[assignment]  # widens the cards' vocabulary
    """Ready | Progressing | Degraded | WeightSyncing | Valid | Autoscaling."""


class RoleStatus(CardModel):
    """Workers of one role."""

    ready: int = Field(default=0, ge=0)
    """Replicas ready to serve."""
    desired: int = Field(default=0, ge=0)
    """Replicas the card asks for."""
    weights_version: str | None = None
    """Weights version the ready replicas serve (`mixed` during a rolling sync)."""


class WeightSyncStatus(CardModel):
    """Progress of the current (or last) weight sync; lets a restarted operator resume it."""

    phase: SyncPhase = "Idle"
    """Idle | Syncing | Done | Failed."""
    target_versions: dict[str, str] = Field(default_factory=dict)
    """Component name -> weightsVersion being rolled out."""
    workers: dict[str, WorkerStep] = Field(default_factory=dict)
    """Worker name -> its step: Waiting, Freezing, Draining, Transferring, Bumping, Resuming,
    Done or Failed."""
    updated: int = Field(default=0, ge=0)
    """Workers on the target versions."""
    total: int = Field(default=0, ge=0)
    """Workers to update."""
    started_at: datetime | None = Field(default=None, strict=False)
    """When the sync started."""
    message: str = ""
    """What the sync waits for, or why it failed."""


PushMode = Literal["barrier", "rolling", "keep"]
PushState = Literal["receiving", "swapping", "done", "failed"]


class PushStatus(CardModel):
    """A trainer's latest weight push into the card's workers (docs/rl.md); a restarted or newly
    owning operator serves a push every worker staged from it."""

    update_id: str
    """The push's id (GET /cards/{namespace}/{name}/v1/weights/updates/{updateId})."""
    version: str
    """The weights version the trainer pushed."""
    mode: PushMode
    """barrier | rolling | keep: how the workers swap it in."""
    state: PushState
    """receiving (workers joining and staging) | swapping (every worker staged it; the weight
    sync swaps it in) | done (every worker serves it) | failed (nothing changed: see error)."""
    workers: list[str] = Field(default_factory=list)
    """Every worker of the push, in rank order (the trainer is rank 0)."""
    staged: list[str] = Field(default_factory=list)
    """Workers that received and checked every bucket."""
    base_version: str = ""
    """The card's weightsVersion when the push opened: a card edit since then wins over it."""
    kv: str = ""
    """Mode keep: keep | recompute (the running requests' KV)."""
    store_address: str = ""
    """host:port of the trainer's TCPStore the workers met at."""
    timeout_seconds: float = Field(default=60.0, ge=0)
    """The bound on the rendezvous and on every collective."""
    error: str = ""
    """Why the push failed."""


class DeploymentCardStatus(CardModel):
    """What the operator last observed and did."""

    phase: Phase | None = None
    """Pending | Progressing | Ready | Degraded | WeightSyncing | Invalid | Failed."""
    conditions: list[DeploymentCondition] = Field(
        default_factory=list, max_length=8, json_schema_extra=list_map("type")
    )
    """Ready, Progressing, Degraded, WeightSyncing, Valid and Autoscaling, at most one of each."""
    observed_generation: int | None = Field(default=None, ge=0)
    """metadata.generation the status describes."""
    roles: dict[RoleName, RoleStatus] = Field(default_factory=dict)
    """Per role: ready and desired replicas and their weights version."""
    ready_roles: str | None = None
    """Roles with all replicas ready / roles, e.g. `2/2` (printed by kubectl get)."""
    weights_version: str | None = None
    """Weights version every worker serves, e.g. `v2` (printed by kubectl get)."""
    replicas: str | None = None
    """Per role, workers serving / desired, e.g. `prefill 1/1, decode 2/3` (printed by kubectl
    get; desired is the role's RoleScale after the card's bounds)."""
    weight_sync: WeightSyncStatus | None = None
    """The current or last weight sync."""
    push: PushStatus | None = None
    """A trainer's latest weight push, when one was made (docs/rl.md)."""
    served_push: PushStatus | None = None
    """The latest push every worker staged: the fleet serves its version unless the card's
    weightsVersion changed since it opened."""
    endpoint: str | None = None
    """URL of the router's OpenAI endpoint."""
    fleet_record: str | None = Field(default=None, max_length=1048576)
    """The fleet controller's record (versioned JSON: sync progress per worker, restart history,
    retirements): a restarted operator resumes a weight sync from it. Written by the operator."""
