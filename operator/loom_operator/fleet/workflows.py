"""A DeploymentCard's workflows as its router runs them (ROUTER.json's `workflows`), with each
stage's router URL, which the substrate resolves (`loom up`: the other fleet's state; Kubernetes:
the other card's Service). The rules between the workflows and the served model are in
api/compatibility.py.

Pure; never looks a card up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loom_operator.api.deployment_card import DeploymentCard


def stage_cards(deployment: DeploymentCard) -> tuple[str, ...]:
    """Every other DeploymentCard the card's workflows run a stage on, each once."""
    return tuple(dict.fromkeys(c for flow in deployment.spec.workflows for c in flow.cards()))


def workflows_document(deployment: DeploymentCard, urls: Mapping[str, str]) -> list[dict[str, Any]]:
    """ROUTER.json's `workflows`; `urls`: the router URL of each card in `stage_cards`."""
    return [
        {
            "name": flow.name,
            "stages": [
                {
                    "name": stage.name,
                    "card": stage.deployment_card or deployment.name,
                    "route": stage.route,
                    "url": None if stage.deployment_card is None else urls[stage.deployment_card],
                }
                for stage in flow.stages
            ],
        }
        for flow in deployment.spec.workflows
    ]
