"""The ConfigMap of one deployment: the worker's ModelCard, the DeploymentCard, ROUTER.json.

Pure; never holds secrets (the control token is a Secret the operator makes).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.fleet.commands import (
    diffusion_steps,
    program_steps,
    router_document,
    worker_card,
)
from loom_operator.fleet.desired import served_component
from loom_operator.fleet.workflows import stage_cards, workflows_document
from loom_operator.k8s.labels import cards_object, common, router_object
from loom_runtime.card.model_card import ModelCard
from loom_runtime.wire.pods import HTTP_PORT, ROUTER_PORTS

MODEL_CARD_KEY, DEPLOYMENT_CARD_KEY, ROUTER_KEY = (
    "model-card.yaml",
    "deployment-card.yaml",
    "router.json",
)
MOUNT_PATH = "/etc/loom"


def cards_config_map(model: ModelCard, deployment: DeploymentCard) -> dict[str, Any]:
    served = served_component(model)
    doc = deployment.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc.pop("status", None)
    urls = {card: router_url(card) for card in stage_cards(deployment)}
    router = router_document(
        deployment, model.name, None, diffusion_steps(model), program_steps(model),
        workflows_document(deployment, urls),
    )  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": cards_object(deployment.name),
            "labels": common(deployment.name, "config"),
        },
        "data": {
            MODEL_CARD_KEY: worker_card(model, served.source.uri, served.weights_version),
            DEPLOYMENT_CARD_KEY: yaml.safe_dump(doc, sort_keys=False),
            ROUTER_KEY: json.dumps(router, indent=1, sort_keys=True),
        },
    }


def router_url(deployment: str) -> str:
    """The OpenAI URL of a card's router Service, from a pod of the same namespace."""
    return f"http://{router_object(deployment)}:{ROUTER_PORTS[HTTP_PORT]}"


def cards_volume(deployment: DeploymentCard) -> dict[str, Any]:
    return {"name": "cards", "configMap": {"name": cards_object(deployment.name)}}


CARDS_MOUNT = {"name": "cards", "mountPath": MOUNT_PATH, "readOnly": True}
