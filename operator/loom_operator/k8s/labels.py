"""The names of the objects the operator renders, and their label sets.

Owns object naming; the labels, annotations and ports a pod shares with the router are
`loom_runtime.wire.pods`.
"""

from __future__ import annotations

from loom_operator.api.roles import RoleName
from loom_runtime.wire.pods import COMPONENT_LABEL, DEPLOYMENT_LABEL, ROLE_LABEL

GROUP = "loom.dev"
VERSION = "v1alpha1"
MANAGED_BY = "app.kubernetes.io/managed-by"
OPERATOR = "loom-operator"
FIELD_MANAGER = "loom-operator"
SCALE_MANAGER = "loom-operator-scale"
"""Owns each role StatefulSet's spec.replicas (k8s/pod_count.py); the renders never carry it once
the StatefulSet exists."""


def role_object(deployment: str, role: RoleName) -> str:
    """StatefulSet and headless Service of one role: `<deployment>-<role>`."""
    return f"{deployment}-{role}"


def router_object(deployment: str) -> str:
    return f"{deployment}-router"


def cards_object(deployment: str) -> str:
    """The ConfigMap carrying both cards (and the router's ROUTER.json)."""
    return f"{deployment}-cards"


def control_secret(deployment: str) -> str:
    """The Secret holding the workers' control token (made by the operator, never rendered)."""
    return f"{deployment}-control"


def common(deployment: str, component: str) -> dict[str, str]:
    return {DEPLOYMENT_LABEL: deployment, COMPONENT_LABEL: component, MANAGED_BY: OPERATOR}


def worker_selector(deployment: str, role: RoleName) -> dict[str, str]:
    return {DEPLOYMENT_LABEL: deployment, ROLE_LABEL: role}


def router_selector(deployment: str) -> dict[str, str]:
    return {DEPLOYMENT_LABEL: deployment, COMPONENT_LABEL: "router"}
