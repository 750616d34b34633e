"""The NetworkPolicies of one deployment: only the operator reaches the workers' control port
and the router's admin port; only the router (and the operator's probes) reach the workers'
OpenAI port and KV-event sockets; workers reach each other (KV transfer), and so do the pods
labelled as the card's trainers (a push's gloo group); clients reach the router's OpenAI port.

Pure; rendered only when the operator runs with `--network-policies` (the chart's default), since
they need to know where the operator runs. A cluster without a network plugin that enforces
NetworkPolicies (the e2e harness has none) accepts and ignores them.
"""

from __future__ import annotations

from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.k8s.labels import common
from loom_operator.k8s.settings import RenderSettings
from loom_runtime.wire.pods import (
    COMPONENT_LABEL,
    CONTROL_PORT,
    DEPLOYMENT_LABEL,
    HTTP_PORT,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    ROUTER_ADMIN_PORT,
    TRAINER_LABEL,
)

NAMESPACE_NAME = "kubernetes.io/metadata.name"


def _ports(*names: str) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": n} for n in names]


def _namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: name}}}


def _policy(name: str, labels: dict[str, str], pods: dict[str, str], ingress: list[Any]) -> Any:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }  # fmt: skip


def network_policies(deployment: DeploymentCard, settings: RenderSettings) -> list[dict[str, Any]]:
    """The workers' and the router's NetworkPolicy (none without `settings.network_policies`)."""
    if not settings.network_policies:
        return []
    name = deployment.name
    operator = {
        **_namespace(settings.operator_namespace),
        "podSelector": {"matchLabels": dict(settings.operator_labels)},
    }
    router = {"podSelector": {"matchLabels": {DEPLOYMENT_LABEL: name, COMPONENT_LABEL: "router"}}}
    worker_pods = {DEPLOYMENT_LABEL: name, COMPONENT_LABEL: "worker"}
    workers_in = [
        {"from": [operator], "ports": _ports(CONTROL_PORT, HTTP_PORT)},
        {"from": [router], "ports": _ports(HTTP_PORT, KV_EVENTS_PORT, KV_REPLAY_PORT)},
        {"from": [{"podSelector": {"matchLabels": worker_pods}}]},  # KV transfer, any port
        {"from": [{"podSelector": {"matchLabels": {TRAINER_LABEL: name}}}]},  # pushes, any port
    ]
    if settings.metrics_namespaces:
        scrapers = [_namespace(ns) for ns in settings.metrics_namespaces]
        workers_in.append({"from": scrapers, "ports": _ports(HTTP_PORT)})
    router_pods = {DEPLOYMENT_LABEL: name, COMPONENT_LABEL: "router"}
    router_in = [
        {"from": [operator], "ports": _ports(ROUTER_ADMIN_PORT)},
        {"ports": _ports(HTTP_PORT)},  # the OpenAI API, from anywhere
    ]
    return [
        _policy(f"{name}-workers", common(name, "worker"), worker_pods, workers_in),
        _policy(f"{name}-router", common(name, "router"), router_pods, router_in),
    ]
