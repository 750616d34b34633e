"""The operator's own Prometheus metrics: the planner's replicas per role and its decisions by
reason, served on `loom operator --metrics-port`.

Owns the metric names and their registry (one per operator process, carried in kopf's memo);
never decides anything.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from loom_operator.fleet.autoscale import RoleDecision

PLANNED_REPLICAS = "loom:operator_planned_replicas"
DECISIONS = "loom:operator_autoscale_decisions"
ROLE_REPLICAS = "loom:operator_role_desired_replicas"
LABELS = ("namespace", "deployment", "role")


class OperatorMetrics:
    """The operator's gauges and counters in a registry of their own."""

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

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Serve /metrics on `address:port` from a daemon thread."""
        start_http_server(port, addr=address, registry=self.registry)
