"""One role's RoleScale: the object `kubectl scale`, an HPA or a KEDA ScaledObject targets.

Pure; renders the identity only (card and role). Its spec.replicas is never rendered: it is
written by whoever scales the role and by the operator's scale rule (k8s/scale_rule.py), so
re-applying the rendered objects never resets a count someone asked for.
"""

from __future__ import annotations

from typing import Any

from loom_operator.api.roles import RoleName
from loom_operator.k8s.labels import common, role_object, worker_selector
from loom_runtime.card.base import API_VERSION
from loom_runtime.wire.pods import ROLE_LABEL


def pod_selector(deployment: str, role: RoleName) -> str:
    """The role's pods as a label selector string (the scale subresource's selector)."""
    return ",".join(f"{k}={v}" for k, v in worker_selector(deployment, role).items())


def role_scale_manifest(deployment: str, role: RoleName) -> dict[str, Any]:
    """The RoleScale `<deployment>-<role>`."""
    labels = {**common(deployment, "scale"), ROLE_LABEL: role}
    return {
        "apiVersion": API_VERSION,
        "kind": "RoleScale",
        "metadata": {"name": role_object(deployment, role), "labels": labels},
        "spec": {"deploymentCard": deployment, "role": role},
    }
