"""The kopf handlers, one concern each: ModelCards are validated; a DeploymentCard is
rendered, applied (server-side apply, one field manager) and its status kept true to what runs.

Owns the operator's I/O with the API server; decisions are the renderers' and status.py's.
Handlers find their settings and client in kopf's `memo` (no module-level state).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.documents import parse_documents
from loom_operator.k8s.kube import MERGE, Kube, KubeError, object_path
from loom_operator.k8s.labels import FIELD_MANAGER, GROUP, VERSION, control_secret
from loom_operator.k8s.render import owner_reference, render
from loom_operator.k8s.settings import RenderSettings
from loom_operator.k8s.status import deployment_status, with_transition_times
from loom_runtime.card.errors import CardError
from loom_runtime.wire.pods import DEPLOYMENT_LABEL

logger = logging.getLogger(__name__)

OBSERVE_INTERVAL_S = 2.0
"""How often a DeploymentCard's status is refreshed from its pods."""
REAPPLY_INTERVAL_S = 30.0
"""How often the rendered objects are applied again, correcting drift."""

Obj = Mapping[str, Any]


def _document(obj: Obj) -> dict[str, Any]:
    """The card as a user wrote it: apiVersion, kind, name, namespace and spec."""
    meta = obj["metadata"]
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
            "spec": dict(obj["spec"])}  # fmt: skip


def _problems(exc: CardError) -> str:
    """Every problem with its field path, in one condition message."""
    return "; ".join(f"{e.path}: {e.message}" if e.path else e.message for e in exc.errors)


def validity(obj: Obj, problem: str | None) -> dict[str, Any]:
    """The status fields that say whether the card is valid (`problem` None: it is)."""
    generation = int(obj["metadata"].get("generation") or 0)
    cond = {"type": "Valid", "status": "False" if problem else "True",
            "reason": "InvalidSpec" if problem else "CardValid",
            "message": problem or "the card is valid",
            "observedGeneration": generation}  # fmt: skip
    previous = list((obj.get("status") or {}).get("conditions") or [])
    others = [c for c in previous if c.get("type") != "Valid"] if not problem else []
    out: dict[str, Any] = {"conditions": [*others, *with_transition_times([cond], previous)]}
    if problem:
        out |= {"phase": "Invalid", "observedGeneration": generation}
    return out


def _write(patch: kopf.Patch, fields: Mapping[str, Any]) -> None:
    for key, value in fields.items():
        patch.status[key] = value


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60


@kopf.on.resume(GROUP, VERSION, "modelcards")
@kopf.on.create(GROUP, VERSION, "modelcards")
@kopf.on.update(GROUP, VERSION, "modelcards", field="spec")
def validate_model_card(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """A ModelCard's own rules (every error with its field path) into `Valid`; the
    DeploymentCards that serve it are rendered again."""
    try:
        parse_documents([(0, _document(body))], str(body.metadata.name))
        problem = None
    except CardError as exc:
        problem = _problems(exc)
    _write(patch, validity(body, problem))
    kube: Kube = memo.kube
    namespace = str(body.metadata.namespace)
    for card in kube.get(object_path("DeploymentCard", namespace))["items"]:
        if card["spec"].get("modelCard") == body.metadata.name:
            fields = reconcile(card, memo)
            if fields is not None:
                path = object_path("DeploymentCard", namespace, card["metadata"]["name"], "status")
                kube.patch(path, {"status": fields}, MERGE)


def reconcile(card: Obj, memo: kopf.Memo) -> dict[str, Any] | None:
    """Render the DeploymentCard with its ModelCard and apply every object; the status fields
    to write when the cards are invalid together, else None."""
    kube: Kube = memo.kube
    settings: RenderSettings = memo.settings
    meta = card["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    model_name = str(card["spec"].get("modelCard", ""))
    try:
        model_doc = _document(kube.get(object_path("ModelCard", namespace, model_name)))
    except KubeError as exc:
        if exc.status != 404:
            raise
        return validity(card, f"spec.modelCard: no ModelCard {model_name!r} in {namespace}")
    try:
        cards = parse_documents([(0, model_doc), (1, _document(card))], namespace)
    except CardError as exc:
        return validity(card, _problems(exc))
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    _ensure_secret(kube, namespace, name, str(meta["uid"]))
    manifests = render(model, deployment, str(meta["uid"]), settings)
    for manifest in manifests:
        kube.apply(manifest, FIELD_MANAGER)
    logger.info("applied %d objects of %s/%s", len(manifests), namespace, name)
    if (card.get("status") or {}).get("phase") == "Invalid":
        return validity(card, None) | {"phase": "Progressing"}
    return None


def _ensure_secret(kube: Kube, namespace: str, name: str, uid: str) -> None:
    """The workers' control token and the router's admin token: made once, never rendered (a
    re-render never rotates them)."""
    secret = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": control_secret(name), "namespace": namespace,
                     "labels": {DEPLOYMENT_LABEL: name},
                     "ownerReferences": [owner_reference(name, uid)]},
        "stringData": {"token": secrets.token_urlsafe(32),
                       "admin-token": secrets.token_urlsafe(32)},
    }  # fmt: skip
    try:
        kube.create(object_path("Secret", namespace), secret)
    except KubeError as exc:
        if exc.status != 409:
            raise


@kopf.on.resume(GROUP, VERSION, "deploymentcards")
@kopf.on.create(GROUP, VERSION, "deploymentcards")
@kopf.on.update(GROUP, VERSION, "deploymentcards", field="spec")
def apply_deployment_card(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _write(patch, reconcile(body, memo) or {})


@kopf.timer(GROUP, VERSION, "deploymentcards", interval=REAPPLY_INTERVAL_S,
            initial_delay=REAPPLY_INTERVAL_S)  # fmt: skip
def correct_drift(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Apply again: whatever was edited or deleted by hand comes back as rendered."""
    _write(patch, reconcile(body, memo) or {})


@kopf.timer(GROUP, VERSION, "deploymentcards", interval=OBSERVE_INTERVAL_S)
def observe(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """status from the StatefulSets and pods: Ready only once every pod of the current revision
    serves; a crash loop shows in Degraded."""
    status = body.get("status") or {}
    if status.get("phase") == "Invalid":
        return  # until the spec (or its ModelCard) changes and is judged again
    try:
        card = DeploymentCard.model_validate(_document(body))
    except ValidationError:
        return
    kube: Kube = memo.kube
    namespace, selector = str(body.metadata.namespace), f"{DEPLOYMENT_LABEL}={body.metadata.name}"
    sets = kube.get(object_path("StatefulSet", namespace), labelSelector=selector)["items"]
    pods = kube.get(object_path("Pod", namespace), labelSelector=selector)["items"]
    generation = int(body.metadata.get("generation") or 0)
    fresh = deployment_status(card, generation, {s["metadata"]["name"]: s for s in sets}, pods)
    fresh["conditions"] = with_transition_times(fresh["conditions"], status.get("conditions") or [])
    if any(status.get(k) != v for k, v in fresh.items()):
        _write(patch, fresh)
