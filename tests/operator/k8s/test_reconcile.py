"""What the operator refuses before rendering: cards that do not parse together — a readable
Valid=False, never ignored — and what it serves (an autoscaling section: the planner runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from loom_operator.k8s.reconcile import load_cards

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def documents() -> tuple[dict[str, Any], dict[str, Any]]:
    model, deployment = yaml.safe_load_all((EXAMPLES / "tiny-pd.yaml").read_text())
    for doc in (model, deployment):
        doc["metadata"]["namespace"] = "ns"
    return model, deployment


def test_valid_cards_load() -> None:
    model, deployment = documents()
    loaded = load_cards(model, deployment)
    assert not isinstance(loaded, str)


def test_an_autoscaling_section_is_served_on_kubernetes() -> None:
    model, deployment = documents()
    deployment["spec"]["autoscaling"] = {"decode": {"min": 1, "max": 3}}
    loaded = load_cards(model, deployment)
    assert not isinstance(loaded, str), loaded
    assert loaded[1].spec.autoscaling is not None


def test_a_missing_model_card_is_named() -> None:
    _, deployment = documents()
    assert load_cards(None, deployment) == "spec.modelCard: no ModelCard 'tiny' in ns"
