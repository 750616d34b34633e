"""What the fleet should be: worker slots per role, the weights they serve, sync/failover limits.

Owns converting the cards once into `DesiredFleet` (plain data); never looks at live workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from loom_operator.api.autoscaling import Autoscaling, ScaleBounds
from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.roles import ROLE_NAMES, RoleName
from loom_operator.fleet.autoscale import AutoscalePolicy, Capacity, RoleBounds, Targets
from loom_runtime.card.component import Component
from loom_runtime.card.model_card import ModelCard
from loom_runtime.card.serving import SyncStrategyName

Strategy = Literal[SyncStrategyName, "Keep"]
"""A strategy name, as the card allows it or a push's mode picks it (Keep: a push in mode keep);
`strategies/registry.py` maps it to its object."""


class FleetError(ValueError):
    """The cards cannot be turned into a fleet (e.g. the DeploymentCard names another model)."""


@dataclass(frozen=True)
class WorkerSlot:
    """One worker the fleet should run: `<deployment>-<role>-<index>`."""

    name: str
    role: RoleName
    index: int


@dataclass(frozen=True)
class SyncPolicy:
    """How workers move to new weights (DeploymentCard spec.weightSync)."""

    strategy: Strategy = "Rolling"
    max_unavailable: int = 1
    """Rolling: workers out of routing at once, whatever the reason."""
    drain_timeout_s: float = 60.0
    """How long a frozen worker may take to finish its requests before they are migrated."""
    load_timeout_s: float = 600.0
    """How long LoadWeights may take before the sync halts and says which worker is stuck."""
    kv: str = ""
    """Keep (a push in mode keep): the push's kv policy, keep | recompute; "" otherwise."""


@dataclass(frozen=True)
class FailoverPolicy:
    """When a worker counts as failed and how it is restarted (spec.failover + restart backoff).

    The backoff and crash-loop numbers are not card fields (yet); the defaults follow kubelet's
    shape: doubling from `backoff_base_s`, capped at `backoff_cap_s`.
    """

    health_timeout_s: float = 5.0
    """A worker that was ready and has not answered its probe for this long has failed."""
    startup_timeout_s: float = 600.0
    """A (re)started worker that is not ready after this long has failed (weights load first)."""
    migration_limit: int = 3
    """Times one request may be migrated (the router enforces it; carried for the shell)."""
    backoff_base_s: float = 1.0
    """Delay before the first restart after a failure; doubles with each failure in the window."""
    backoff_cap_s: float = 60.0
    """Longest delay between restarts; a crash-looping worker is retried at this period."""
    crash_loop_failures: int = 5
    """Failures within `crash_loop_window_s` that make a worker crash-looping (Degraded)."""
    crash_loop_window_s: float = 300.0
    """Failures older than this are forgotten: the backoff resets after a quiet window."""


@dataclass(frozen=True)
class RoleTarget:
    """How many workers of one role to run, and which: `indices` when the planner chose which
    worker left (else 0 .. replicas - 1)."""

    role: RoleName
    replicas: int
    indices: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.indices is not None and (
            len(set(self.indices)) != self.replicas or min(self.indices, default=0) < 0
        ):
            raise FleetError(f"{self.role}: indices {self.indices} for {self.replicas} replicas")

    @property
    def slot_indices(self) -> tuple[int, ...]:
        return tuple(range(self.replicas)) if self.indices is None else tuple(sorted(self.indices))


@dataclass(frozen=True)
class DesiredFleet:
    """The fleet the cards ask for, converted once from pydantic cards to plain data."""

    deployment: str
    component: str
    """The served component: the one whose weights the workers load and report."""
    weights_version: str
    """Target weights version of the served component."""
    source_uri: str
    """Where the target weights live (what StartWorker, RestartWorker and LoadWeights load)."""
    roles: tuple[RoleTarget, ...]
    sync: SyncPolicy = field(default_factory=SyncPolicy)
    failover: FailoverPolicy = field(default_factory=FailoverPolicy)
    autoscale: AutoscalePolicy | None = None
    """Loom's planner moves these roles' replicas; None: the card's replicas are fixed."""

    def __post_init__(self) -> None:
        names = [t.role for t in self.roles]
        if len(set(names)) != len(names):
            raise FleetError(f"{self.deployment}: a role is listed twice in {names}")
        if "aggregated" in names and ("prefill" in names or "decode" in names):
            raise FleetError(f"{self.deployment}: aggregated excludes prefill and decode")
        if "prefill" in names and "decode" not in names:
            raise FleetError(f"{self.deployment}: a prefill role requires a decode role")
        if self.sync.max_unavailable < 1:
            raise FleetError(f"{self.deployment}: weightSync.maxUnavailable must be at least 1")
        ordered = tuple(sorted(self.roles, key=lambda t: ROLE_NAMES.index(t.role)))
        object.__setattr__(self, "roles", ordered)

    @property
    def disaggregated(self) -> bool:
        """True when prompts go to prefill workers and tokens come from decode workers."""
        return any(t.role == "prefill" for t in self.roles)

    def replicas(self, role: RoleName) -> int:
        """Desired workers of `role` (0 for a role the card does not declare)."""
        return next((t.replicas for t in self.roles if t.role == role), 0)

    @cached_property
    def slots(self) -> tuple[WorkerSlot, ...]:
        """Every worker the fleet should run, ordered by index, then prefill, decode, aggregated.

        That order interleaves roles, so a rolling sync alternates between them.
        """
        slots = [
            WorkerSlot(worker_name(self.deployment, t.role, i), t.role, i)
            for t in self.roles
            for i in t.slot_indices
        ]
        return tuple(sorted(slots, key=lambda s: (s.index, ROLE_NAMES.index(s.role))))

    def with_replicas(self, replicas: dict[RoleName, int]) -> DesiredFleet:
        """The same fleet with these roles' replicas (the planner's decision) in place."""
        roles = tuple(RoleTarget(t.role, replicas.get(t.role, t.replicas)) for t in self.roles)
        return replace(self, roles=roles)

    def with_indices(self, indices: dict[RoleName, tuple[int, ...]]) -> DesiredFleet:
        """The same fleet with these roles running exactly these slot indices (the planner chose
        which workers stay)."""
        roles = tuple(
            t if t.role not in indices else RoleTarget(t.role, len(indices[t.role]),
                                                       indices[t.role])
            for t in self.roles
        )  # fmt: skip
        return replace(self, roles=roles)

    def slot(self, name: str) -> WorkerSlot | None:
        """The slot called `name`, or None when no desired worker has that name."""
        return next((s for s in self.slots if s.name == name), None)


def worker_name(deployment: str, role: RoleName, index: int) -> str:
    """The stable name of a worker: `<deployment>-<role>-<index>` (a pod name on Kubernetes)."""
    return f"{deployment}-{role}-{index}"


def served_component(model: ModelCard) -> Component:
    """The component whose weights the workers serve: the first transformer of the loop the
    recipe assumes (or that loop's first component)."""
    names = model.loop(model.spec.recipe.assumes_loop).components
    components = [model.component(n) for n in names]
    return next((c for c in components if c.kind == "transformer"), components[0])


def desired_fleet(
    model: ModelCard, deployment: DeploymentCard, failover: FailoverPolicy | None = None
) -> DesiredFleet:
    """The DesiredFleet of `deployment` serving `model`.

    `failover` supplies the restart backoff (not in the card); its health timeout and
    migration limit are replaced by the card's. Raises FleetError if the cards do not match.
    """
    spec = deployment.spec
    if spec.model_card != model.name:
        raise FleetError(
            f"DeploymentCard {deployment.name} serves ModelCard {spec.model_card!r}, "
            f"not {model.name!r}: pass the ModelCard it names"
        )
    comp = served_component(model)
    base = failover or FailoverPolicy()
    return DesiredFleet(
        deployment=deployment.name,
        component=comp.name,
        weights_version=comp.weights_version,
        source_uri=comp.source.uri,
        roles=tuple(RoleTarget(n, r.replicas) for n, r in spec.roles.present().items()),
        sync=SyncPolicy(
            strategy=spec.weight_sync.strategy,
            max_unavailable=spec.weight_sync.max_unavailable,
            drain_timeout_s=float(spec.weight_sync.drain_timeout_seconds),
        ),
        failover=FailoverPolicy(
            health_timeout_s=spec.failover.health_timeout_seconds,
            startup_timeout_s=base.startup_timeout_s,
            migration_limit=spec.failover.migration_limit,
            backoff_base_s=base.backoff_base_s,
            backoff_cap_s=base.backoff_cap_s,
            crash_loop_failures=base.crash_loop_failures,
            crash_loop_window_s=base.crash_loop_window_s,
        ),
        autoscale=None if spec.autoscaling is None else autoscale_policy(spec.autoscaling),
    )


def autoscale_policy(section: Autoscaling) -> AutoscalePolicy:
    """The card's autoscaling section as the planner's plain data (milliseconds to seconds)."""
    t, c = section.targets, section.capacity
    bounds: dict[RoleName, ScaleBounds | None] = {
        "prefill": section.prefill,
        "decode": section.decode,
        "aggregated": section.aggregated,
    }
    return AutoscalePolicy(
        roles={r: RoleBounds(b.min, b.max) for r, b in bounds.items() if b is not None},
        targets=Targets(
            ttft_p90_s=None if t.ttft_p90_ms is None else t.ttft_p90_ms / 1000,
            itl_p90_s=None if t.itl_p90_ms is None else t.itl_p90_ms / 1000,
            queue=t.queue,
            kv_usage=t.kv_usage,
            prefill_tokens=t.prefill_tokens,
        ),
        capacity=Capacity(
            prefill_tokens_s=c.prefill_tokens_per_second,
            decode_tokens_s=c.decode_tokens_per_second,
            decode_sequences=c.decode_sequences,
            utilization=c.utilization,
        ),
        scale_up_s=section.scale_up_seconds,
        scale_down_s=section.scale_down_seconds,
        planner=section.planner,
    )
