"""Fixtures for the card tests: a valid tiny ModelCard as plain YAML data."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def card_data() -> dict[str, Any]:
    """A valid ModelCard document (fresh for each test, safe to mutate)."""
    return {
        "apiVersion": "loom.dev/v1alpha1",
        "kind": "ModelCard",
        "metadata": {"name": "tiny"},
        "spec": {
            "family": "llama",
            "components": [
                {
                    "name": "decoder",
                    "kind": "transformer",
                    "source": {"uri": "loom://tiny"},
                    "precision": {"weights": "fp32", "kv": "fp32"},
                    "requiredFor": ["generate"],
                }
            ],
            "loops": [
                {
                    "name": "generate",
                    "kind": "ar_decode",
                    "components": ["decoder"],
                    "cachePolicy": "prefix",
                }
            ],
            "recipe": {"method": "base", "assumesLoop": "generate", "assumesPrecision": "fp32"},
        },
    }
