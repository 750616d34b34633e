"""Fixtures for the DeploymentCard tests: valid card documents as plain YAML data."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def model_data() -> dict[str, Any]:
    """A valid tiny ModelCard document."""
    return {
        "apiVersion": "loom.dev/v1alpha1",
        "kind": "ModelCard",
        "metadata": {"name": "tiny"},
        "spec": {
            "family": "llama",
            "components": [
                {"name": "decoder", "kind": "transformer", "source": {"uri": "loom://tiny"}}
            ],
            "loops": [{"name": "generate", "kind": "ar_decode", "components": ["decoder"]}],
            "recipe": {"method": "base", "assumesLoop": "generate", "assumesPrecision": "bf16"},
        },
    }


@pytest.fixture
def deploy_data() -> dict[str, Any]:
    """A valid prefill/decode DeploymentCard document for the tiny model."""
    return {
        "apiVersion": "loom.dev/v1alpha1",
        "kind": "DeploymentCard",
        "metadata": {"name": "tiny-pd"},
        "spec": {
            "modelCard": "tiny",
            "roles": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
        },
    }
