"""Renders one DeploymentCard with its ModelCard and applies what drifted (server-side apply,
one field manager, only what differs from the watch cache), or says why the cards cannot be
applied (the status fields of `Valid`).

Owns the operator's writes of a card's objects and of its token Secret; never decides when to
apply (kopf's handlers and the card's loop call `reconcile`) and never runs a fleet round.
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.documents import parse_documents
from loom_operator.api.roles import RoleName
from loom_operator.k8s.drift import Applied, key_of
from loom_operator.k8s.kube import MERGE, Kube, KubeError, object_path
from loom_operator.k8s.labels import FIELD_MANAGER, SCALE_MANAGER, control_secret, role_object
from loom_operator.k8s.render import owner_reference, render, start_replicas
from loom_operator.k8s.render.model_volumes import claim_change
from loom_operator.k8s.render.vllm import unsupported
from loom_operator.k8s.round_inputs import digest
from loom_operator.k8s.scale_status import owns_replicas
from loom_operator.k8s.scaler import replicas_of, take_replicas
from loom_operator.k8s.settings import RenderSettings
from loom_operator.k8s.status import with_transition_times
from loom_operator.k8s.watched import CardCache
from loom_runtime.card.errors import CardError
from loom_runtime.card.model_card import ModelCard
from loom_runtime.wire.pods import DEPLOYMENT_LABEL

logger = logging.getLogger(__name__)

CLAIM_CHANGE = "ClaimChange"
"""Valid's reason when the cards' pvc:// sources name other claims than the running pods mount."""

Obj = Mapping[str, Any]


def document(obj: Obj) -> dict[str, Any]:
    """The card as a user wrote it: apiVersion, kind, name, namespace and spec."""
    meta = obj["metadata"]
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
            "spec": dict(obj["spec"])}  # fmt: skip


def problems(exc: CardError) -> str:
    """Every problem with its field path, in one condition message."""
    return "; ".join(f"{e.path}: {e.message}" if e.path else e.message for e in exc.errors)


def validity(obj: Obj, problem: str | None, reason: str = "InvalidSpec") -> dict[str, Any]:
    """The status fields that say whether the card is valid (`problem` None: it is)."""
    generation = int(obj["metadata"].get("generation") or 0)
    cond = {"type": "Valid", "status": "False" if problem else "True",
            "reason": reason if problem else "CardValid",
            "message": problem or "the card is valid",
            "observedGeneration": generation}  # fmt: skip
    previous = list((obj.get("status") or {}).get("conditions") or [])
    others = [c for c in previous if c.get("type") != "Valid"] if not problem else []
    out: dict[str, Any] = {"conditions": [*others, *with_transition_times([cond], previous)]}
    if problem:
        out |= {"phase": "Invalid", "observedGeneration": generation}
    return out


def write_status(kube: Kube, card: Obj, fields: Mapping[str, Any] | None) -> None:
    """Status fields a reconcile returned, written outside a kopf handler's patch."""
    if fields:
        meta = card["metadata"]
        path = object_path("DeploymentCard", str(meta["namespace"]), str(meta["name"]), "status")
        kube.patch(path, {"status": dict(fields)}, MERGE)


def load_cards(model_doc: Obj | None, card: Obj) -> tuple[ModelCard, DeploymentCard] | str:
    """The cards parsed and checked together, or the problem (with field paths) when they are
    not valid; `model_doc` None: the ModelCard the card names does not exist."""
    namespace = str(card["metadata"]["namespace"])
    if model_doc is None:
        model_name = card["spec"].get("modelCard", "")
        return f"spec.modelCard: no ModelCard {model_name!r} in {namespace}"
    try:
        cards = parse_documents([(0, model_doc), (1, document(card))], namespace)
    except CardError as exc:
        return problems(exc)
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    if deployment.spec.backend == "vllm":
        missing = unsupported(model, deployment)
        if missing:
            return "; ".join(f"{path}: {message}" for path, message in missing)
    return model, deployment


def _model_doc(kube: Kube, card: Obj, cache: CardCache) -> Obj | None:
    """The card's ModelCard from the watch cache, else (not there yet) from the API server."""
    if cache.model_doc is not None:
        return cache.model_doc
    namespace, model_name = str(card["metadata"]["namespace"]), card["spec"].get("modelCard", "")
    try:
        return document(kube.get(object_path("ModelCard", namespace, str(model_name))))
    except KubeError as exc:
        if exc.status != 404:
            raise
        return None


def _statefulsets(kube: Kube, namespace: str, name: str, roles: Iterable[RoleName],
                  cache: CardCache) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The card's StatefulSets from the watch cache; a role's the cache lacks is asked of the API
    server (just made, its event not here yet: its replicas are the scaler's already)."""
    existing = {s["metadata"]["name"]: s for s in cache.statefulsets}
    for role in roles:
        sts = role_object(name, role)
        if sts not in existing:
            try:
                existing[sts] = kube.get(object_path("StatefulSet", namespace, sts))
            except KubeError as exc:
                if exc.status != 404:
                    raise
    return existing


def reconcile(
    card: Obj, memo: kopf.Memo, cache: CardCache, again: bool = False
) -> dict[str, Any] | None:
    """Render the DeploymentCard with its ModelCard and apply every object that differs from
    what the watch cache holds; the status fields to write when the cards are invalid together,
    else None. One card's reconciles run one at a time; unless `again` (the drift correction), a
    card this process already applied at its generation and ModelCard is left alone (kopf's
    handler and the card's loop both ask after a change: the second finds it done)."""
    kube: Kube = memo.kube
    settings: RenderSettings = memo.settings
    applied: Applied = getattr(memo, "applied", None) or Applied()
    meta = card["metadata"]
    namespace, uid = str(meta["namespace"]), str(meta["uid"])
    with applied.card_lock(namespace, uid):
        model_doc = _model_doc(kube, card, cache)
        at = (int(meta.get("generation") or 0), digest(model_doc))
        if not again and applied.card_at(namespace, uid) == at:
            return None
        fields = _apply(card, model_doc, kube, settings, applied, cache)
        applied.card_applied(namespace, uid, at)
    return fields


def _apply(card: Obj, model_doc: Obj | None, kube: Kube, settings: RenderSettings,
           applied: Applied, cache: CardCache) -> dict[str, Any] | None:  # fmt: skip
    """reconcile's work: the status fields when the cards cannot be applied, else None."""
    meta = card["metadata"]
    namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    cards = load_cards(model_doc, card)
    if isinstance(cards, str):
        return validity(card, cards)
    model, deployment = cards
    start = start_replicas(deployment)
    existing = _statefulsets(kube, namespace, name, start, cache)
    moved = claim_change(model, deployment, existing.values())
    if moved:  # applying would roll every pod onto the new volume, outside the sync
        return validity(card, moved, CLAIM_CHANGE)
    if applied.secret_needed(namespace, uid, cache.markers.get(("Secret", control_secret(name)))):
        data = _ensure_secret(kube, namespace, name, uid, applied.secret_data(namespace, uid))
        applied.secret_made(namespace, uid, data)
    for sts in existing.values():  # its count is the scaler's before a render omits it
        if not owns_replicas(sts, SCALE_MANAGER):
            sts_name = sts["metadata"]["name"]
            done = take_replicas(kube, namespace, sts_name, replicas_of(sts))
            applied.wrote(namespace, "StatefulSet", sts_name, done)
    counts = {r: None if role_object(name, r) in existing else n for r, n in start.items()}
    manifests = render(model, deployment, uid, settings, counts)
    sent = 0
    for manifest in manifests:
        key = key_of(manifest, uid)
        if applied.needs_apply(key, manifest, cache.markers.get(key[1:3])):
            applied.record(key, manifest, kube.apply(manifest, FIELD_MANAGER))
            sent += 1
    for role, n in counts.items():
        if n is not None:  # a new StatefulSet: from now on its count is the scaler's
            done = take_replicas(kube, namespace, role_object(name, role), n)
            applied.wrote(namespace, "StatefulSet", role_object(name, role), done)
    if sent:
        logger.info("applied %d of %d objects of %s/%s", sent, len(manifests), namespace, name)
    if (card.get("status") or {}).get("phase") == "Invalid":
        return validity(card, None) | {"phase": "Progressing"}
    return None


def _ensure_secret(kube: Kube, namespace: str, name: str, uid: str,
                   data: dict[str, str] | None) -> dict[str, str]:  # fmt: skip
    """The workers' control token and the router's admin token: made once, never rendered (a
    re-render never rotates them). `data`: the tokens this process made or found before (a
    Secret deleted by hand comes back with them, so the running pods keep working); the tokens
    the Secret holds are returned."""
    made_before = data is not None
    if data is None:
        data = {"token": secrets.token_urlsafe(32), "admin-token": secrets.token_urlsafe(32)}
    secret = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": control_secret(name), "namespace": namespace,
                     "labels": {DEPLOYMENT_LABEL: name},
                     "ownerReferences": [owner_reference(name, uid)]},
        "stringData": data,
    }  # fmt: skip
    try:
        kube.create(object_path("Secret", namespace), secret)
    except KubeError as exc:
        if exc.status != 409:
            raise
        found = kube.get(object_path("Secret", namespace, control_secret(name))).get("data") or {}
        return {k: base64.b64decode(v).decode() for k, v in found.items()}
    if made_before:
        logger.warning("the token Secret of %s/%s was deleted: made again with the same tokens",
                       namespace, name)  # fmt: skip
    return data
