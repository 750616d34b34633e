"""What a Loom pod says about itself on Kubernetes: its labels, annotations and port names.

The contract between the operator (which renders pods) and the router (which watches them);
holds names, default port numbers, and reading a pod spec's named ports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEPLOYMENT_LABEL = "loom.dev/deployment"
ROLE_LABEL = "loom.dev/role"
COMPONENT_LABEL = "app.kubernetes.io/component"  # "worker" | "router"
TRAINER_LABEL = "loom.dev/trainer-of"
"""A user's label on a trainer's pod, its value a DeploymentCard's name: the card's workers let
it in on any port (a push's gloo group) when NetworkPolicies are rendered."""

DRAINING_ANNOTATION = "loom.dev/draining"
"""Set to "true" on a worker the router must stop sending new requests to."""
WEIGHTS_VERSION_ANNOTATION = "loom.dev/weights-version"
"""The weights version the worker serves (rendered at creation; bumped after each load)."""

# Container port names of a worker's runtime container, and the numbers Loom renders.
HTTP_PORT, CONTROL_PORT, KV_EVENTS_PORT, KV_REPLAY_PORT, KV_SIDE_PORT = (
    "http",
    "control",
    "kv-events",
    "kv-replay",
    "kv-side",
)
WORKER_PORTS = {HTTP_PORT: 8000, CONTROL_PORT: 50051, KV_EVENTS_PORT: 5557, KV_REPLAY_PORT: 5558,
                KV_SIDE_PORT: 5600}  # fmt: skip
ROUTER_ADMIN_PORT = "admin"
ROUTER_PORTS = {HTTP_PORT: 8000, ROUTER_ADMIN_PORT: 8001}


def named_ports(spec: Mapping[str, Any]) -> dict[str, int]:
    """Port name -> number over every container of a pod spec (unnamed ports are skipped)."""
    return {
        str(p["name"]): int(p["containerPort"])
        for c in spec.get("containers") or []
        for p in c.get("ports") or []
        if p.get("name")
    }
