"""Fixtures for the Kubernetes tests: a manifest validator that knows Loom's own kinds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from loom_operator.api.crd import CARD_KINDS, crd_manifest

Validate = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="session")
def validate_manifest() -> Validate:
    """Validates a manifest against the Kubernetes 1.35 schemas (strict), or, for a loom.dev
    kind, against its generated CRD's schema."""
    schemas = {
        k.kind: crd_manifest(k)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for k in CARD_KINDS
    }

    def validate(manifest: dict[str, Any]) -> None:
        if str(manifest.get("apiVersion", "")).startswith("loom.dev/"):
            jsonschema.validate(manifest, schemas[manifest["kind"]])
        else:
            kubernetes_validate.validate(manifest, "1.35", strict=True)

    return validate
