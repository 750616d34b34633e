"""The planner's Prometheus metrics, the same on `loom up` and in the Kubernetes operator: the
replicas it decided per role, its decisions by reason, and the workers each role runs toward.

Owns those metric names and their registry; never decides anything.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from loom_operator.fleet.autoscale import RoleDecision

PLANNED_REPLICAS = "loom:operator_planned_replicas"
DECISIONS = "loom:operator_autoscale_decisions"
ROLE_REPLICAS = "loom:operator_role_desired_replicas"
LABELS = ("namespace", "deployment", "role")
"""`namespace` is empty on `loom up`."""


class PlannerMetrics:
    """The planner's gauges and counter in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._planned = Gauge(
            PLANNED_REPLICAS, "Replicas Loom's planner decided for a role (its latest decision)",
            LABELS, registry=self.registry,
        )  # fmt: skip
        self._decisions = Counter(
            DECISIONS, "Planner decisions for a role, by reason (AtTarget, QueueAboveTarget, ...)",
            (*LABELS, "reason"), registry=self.registry,
        )  # fmt: skip
        self._desired = Gauge(
            ROLE_REPLICAS, "Workers a role runs toward (card, RoleScale or planner, within bounds)",
            LABELS, registry=self.registry,
        )  # fmt: skip

    def decision(self, namespace: str, deployment: str, d: RoleDecision) -> None:
        self._planned.labels(namespace, deployment, d.role).set(d.desired)
        self._decisions.labels(namespace, deployment, d.role, d.reason).inc()

    def desired(self, namespace: str, deployment: str, role: str, replicas: int) -> None:
        self._desired.labels(namespace, deployment, role).set(replicas)

    def forget(self, namespace: str, deployment: str, roles: tuple[str, ...]) -> None:
        """A card that is gone takes its series along."""
        for role in roles:
            for gauge in (self._planned, self._desired):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, deployment, role)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (what /metrics answers)."""
        return generate_latest(self.registry)
