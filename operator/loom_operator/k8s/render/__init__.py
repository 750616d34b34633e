"""Pure renderers: (ModelCard, DeploymentCard, settings) -> the manifests of one deployment.

Never calls the API server; every manifest they return validates against the Kubernetes
OpenAPI schemas (tests check it) and carries the DeploymentCard as its owner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.roles import RoleName
from loom_operator.fleet.desired import autoscale_policy
from loom_operator.k8s.render.config import cards_config_map
from loom_operator.k8s.render.network import network_policies
from loom_operator.k8s.render.role_scale import role_scale_manifest
from loom_operator.k8s.render.router import router_manifests
from loom_operator.k8s.render.workers import role_manifests
from loom_operator.k8s.settings import RenderSettings
from loom_runtime.card.model_card import ModelCard

Manifest = dict[str, Any]


def render(
    model: ModelCard,
    deployment: DeploymentCard,
    uid: str,
    settings: RenderSettings,
    replicas: Mapping[RoleName, int | None] | None = None,
) -> list[Manifest]:
    """Every object of the deployment, in apply order (config first, then roles, then router).

    `uid` is the DeploymentCard's metadata.uid, for the owner references that make deletion
    cascade. `replicas`: each role StatefulSet's count, None for one that already exists (its
    count is the operator's scaler's, k8s/pod_count.py); left out, every role starts at its
    card's replicas within the autoscaling bounds.
    """
    owner = owner_reference(deployment.name, uid)
    out = [cards_config_map(model, deployment)]
    counts = start_replicas(deployment) if replicas is None else replicas
    for role in deployment.spec.roles.present():
        out += role_manifests(model, deployment, role, settings, counts.get(role))
        out.append(role_scale_manifest(deployment.name, role))
    out += router_manifests(deployment, settings)
    out += network_policies(deployment, settings)
    for manifest in out:
        manifest["metadata"]["ownerReferences"] = [owner]
        if deployment.metadata.namespace:
            manifest["metadata"]["namespace"] = deployment.metadata.namespace
    return out


def start_replicas(deployment: DeploymentCard) -> dict[RoleName, int | None]:
    """Each role's first count: its `replicas`, within the autoscaling section's bounds."""
    section = deployment.spec.autoscaling
    policy = None if section is None else autoscale_policy(section)
    return {
        role: spec.replicas if policy is None else policy.clamp(role, spec.replicas)
        for role, spec in deployment.spec.roles.present().items()
    }


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "loom.dev/v1alpha1",
        "kind": "DeploymentCard",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
