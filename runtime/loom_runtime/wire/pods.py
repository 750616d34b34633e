"""What a Loom pod says about itself on Kubernetes: its labels, annotations and port names.

The contract between the operator (which renders pods) and the router (which watches them);
never holds anything but names and default port numbers.
"""

from __future__ import annotations

DEPLOYMENT_LABEL = "loom.dev/deployment"
ROLE_LABEL = "loom.dev/role"
COMPONENT_LABEL = "app.kubernetes.io/component"  # "worker" | "router"

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
