"""The volumes of a model's `pvc://claim/path` sources: each claim mounted read-only at
PVC_ROOT/<claim> in every worker container, and the claims a running StatefulSet mounts.

Pure. A weight sync is LoadWeights on running pods, never a rollout, so a card change that would
mount other claims is refused (`claim_change`), not rendered: a new volume in the pod template
would make every StatefulSet replace its pods outside the drain-correct sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.k8s.labels import role_object
from loom_runtime.card.model_card import ModelCard
from loom_runtime.card.source import PVC_ROOT

VOLUME_PREFIX = "model-"
"""Volume names: model-0, model-1, … in the claims' sorted order."""


def claims(model: ModelCard) -> tuple[str, ...]:
    """Every claim the model's components load from, sorted, each once."""
    return tuple(sorted({c.source.claim for c in model.spec.components if c.source.claim}))


def model_volumes(model: ModelCard) -> list[dict[str, Any]]:
    """The pod's volumes: one read-only persistentVolumeClaim per claim."""
    return [
        {"name": f"{VOLUME_PREFIX}{i}",
         "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        for i, claim in enumerate(claims(model))
    ]  # fmt: skip


def model_mounts(model: ModelCard) -> list[dict[str, Any]]:
    """A worker container's mounts: each claim at PVC_ROOT/<claim>, read-only."""
    return [
        {"name": f"{VOLUME_PREFIX}{i}", "mountPath": f"{PVC_ROOT}/{claim}", "readOnly": True}
        for i, claim in enumerate(claims(model))
    ]


def mounted_claims(statefulset: Mapping[str, Any]) -> tuple[str, ...]:
    """The claims a StatefulSet's pod template mounts, sorted."""
    volumes = statefulset.get("spec", {}).get("template", {}).get("spec", {}).get("volumes") or []
    names = {v["persistentVolumeClaim"]["claimName"] for v in volumes
             if "persistentVolumeClaim" in v}  # fmt: skip
    return tuple(sorted(names))


def claim_change(
    model: ModelCard, deployment: DeploymentCard, statefulsets: Iterable[Mapping[str, Any]]
) -> str | None:
    """Why the cards cannot be applied to the running workers: their sources name other claims
    than the pods of a role's StatefulSet mount (None: the same claims, or no StatefulSet yet).

    `statefulsets` are the deployment's as the API server has them; those of roles the card no
    longer has, and those being deleted, are not compared."""
    roles = {role_object(deployment.name, r) for r in deployment.spec.roles.present()}
    wanted = claims(model)
    for sts in sorted(statefulsets, key=lambda s: str(s.get("metadata", {}).get("name"))):
        name = str(sts.get("metadata", {}).get("name"))
        running = mounted_claims(sts)
        going = sts.get("metadata", {}).get("deletionTimestamp")
        if name in roles and not going and running != wanted:
            return _refusal(model, deployment, name, running)
    return None


def _refusal(
    model: ModelCard, deployment: DeploymentCard, sts: str, running: tuple[str, ...]
) -> str:
    moved = [f"spec.components[{i}].source.uri {c.source.uri!r}"
             for i, c in enumerate(model.spec.components)
             if c.source.claim and c.source.claim not in running]  # fmt: skip
    what = ", ".join(moved) or "no source.uri names a claim"
    return (
        f"ModelCard {model.name}: {what}, but the pods of {sts} mount "
        f"{', '.join(f'claim {c}' for c in running) or 'no claim'}: a weight sync loads in place "
        "and cannot change a running pod's volumes. Put the new checkpoint on the mounted claim "
        f"(pvc://<claim>/<path>), or delete and re-apply DeploymentCard {deployment.name} to "
        "start its pods on the new claim"
    )
