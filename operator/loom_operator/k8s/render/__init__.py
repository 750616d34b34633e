"""Pure renderers: (ModelCard, DeploymentCard, settings) -> the manifests of one deployment.

Never calls the API server; every manifest they return validates against the Kubernetes
OpenAPI schemas (tests check it) and carries the DeploymentCard as its owner.
"""

from __future__ import annotations

from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.k8s.render.config import cards_config_map
from loom_operator.k8s.render.network import network_policies
from loom_operator.k8s.render.router import router_manifests
from loom_operator.k8s.render.workers import role_manifests
from loom_operator.k8s.settings import RenderSettings
from loom_runtime.card.model_card import ModelCard

Manifest = dict[str, Any]


def render(
    model: ModelCard, deployment: DeploymentCard, uid: str, settings: RenderSettings
) -> list[Manifest]:
    """Every object of the deployment, in apply order (config first, then roles, then router).

    `uid` is the DeploymentCard's metadata.uid, for the owner references that make deletion
    cascade.
    """
    owner = owner_reference(deployment.name, uid)
    out = [cards_config_map(model, deployment)]
    for role in deployment.spec.roles.present():
        out += role_manifests(model, deployment, role, settings)
    out += router_manifests(deployment, settings)
    out += network_policies(deployment, settings)
    for manifest in out:
        manifest["metadata"]["ownerReferences"] = [owner]
        if deployment.metadata.namespace:
            manifest["metadata"]["namespace"] = deployment.metadata.namespace
    return out


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "loom.dev/v1alpha1",
        "kind": "DeploymentCard",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
