"""The kopf handlers, one concern each: ModelCards are validated; a DeploymentCard is
rendered, applied (server-side apply, one field manager) and its status kept true to what runs.

Owns the operator's I/O with the API server; decisions are the renderers' and status.py's.
Handlers find their settings and client in kopf's `memo` (no module-level state).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.documents import parse_documents
from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.desired import desired_fleet
from loom_operator.fleet.record import FleetRecord, RecordError
from loom_operator.k8s.fleet import Events, PodFleet
from loom_operator.k8s.kube import MERGE, Kube, KubeError, object_path
from loom_operator.k8s.labels import (
    FIELD_MANAGER,
    GROUP,
    SCALE_MANAGER,
    VERSION,
    control_secret,
    role_object,
)
from loom_operator.k8s.metrics import OperatorMetrics
from loom_operator.k8s.render import owner_reference, render, start_replicas
from loom_operator.k8s.render.model_volumes import claim_change
from loom_operator.k8s.render.vllm import unsupported
from loom_operator.k8s.scale_status import owns_replicas
from loom_operator.k8s.scaler import CardScaler, replicas_of, take_replicas
from loom_operator.k8s.settings import RenderSettings
from loom_operator.k8s.status import deployment_status, with_fleet, with_transition_times
from loom_runtime.card.errors import CardError
from loom_runtime.card.model_card import ModelCard
from loom_runtime.wire.pods import DEPLOYMENT_LABEL

logger = logging.getLogger(__name__)

ROUND_S = 2.0
"""Longest time between two fleet rounds of a card (a round also comes at the core's wake_at)."""
BUSY_ROUND_S = 0.3
"""Time to the next round after one that acted on workers (a sync or failover in motion)."""
IDLE_ROUND_S = 5.0
"""Rounds of a card that is invalid: nothing runs, only a spec change can fix it."""
REAPPLY_INTERVAL_S = 30.0
"""How often the rendered objects are applied again, correcting drift."""
CLAIM_CHANGE = "ClaimChange"
"""Valid's reason when the cards' pvc:// sources name other claims than the running pods mount."""

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


def _write(patch: kopf.Patch, fields: Mapping[str, Any]) -> None:
    for key, value in fields.items():
        patch.status[key] = value


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60


@kopf.on.cleanup()
def release_stop_flag(memo: kopf.Memo, **_: Any) -> None:
    """kopf waits for its stop flag in a worker thread; when it stops for another reason (a
    SIGTERM), set the flag so that thread ends and the process exits."""
    flag = getattr(memo, "stop_flag", None)
    if flag is not None:
        flag.set()


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


def load_cards(model_doc: Obj | None, card: Obj) -> tuple[ModelCard, DeploymentCard] | str:
    """The cards parsed and checked together, or the problem (with field paths) when they are
    not valid; `model_doc` None: the ModelCard the card names does not exist."""
    namespace = str(card["metadata"]["namespace"])
    if model_doc is None:
        model_name = card["spec"].get("modelCard", "")
        return f"spec.modelCard: no ModelCard {model_name!r} in {namespace}"
    try:
        cards = parse_documents([(0, model_doc), (1, _document(card))], namespace)
    except CardError as exc:
        return _problems(exc)
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    if deployment.spec.backend == "vllm":
        missing = unsupported(model, deployment)
        if missing:
            return "; ".join(f"{path}: {message}" for path, message in missing)
    return model, deployment


def _model_doc(kube: Kube, card: Obj) -> Obj | None:
    namespace, model_name = str(card["metadata"]["namespace"]), card["spec"].get("modelCard", "")
    try:
        return _document(kube.get(object_path("ModelCard", namespace, str(model_name))))
    except KubeError as exc:
        if exc.status != 404:
            raise
        return None


def reconcile(card: Obj, memo: kopf.Memo) -> dict[str, Any] | None:
    """Render the DeploymentCard with its ModelCard and apply every object; the status fields
    to write when the cards are invalid together, else None."""
    kube: Kube = memo.kube
    settings: RenderSettings = memo.settings
    meta = card["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    cards = load_cards(_model_doc(kube, card), card)
    if isinstance(cards, str):
        return validity(card, cards)
    model, deployment = cards
    sets = kube.get(
        object_path("StatefulSet", namespace), labelSelector=f"{DEPLOYMENT_LABEL}={name}"
    )
    moved = claim_change(model, deployment, sets["items"])
    if moved:  # applying would roll every pod onto the new volume, outside the sync
        return validity(card, moved, CLAIM_CHANGE)
    _ensure_secret(kube, namespace, name, str(meta["uid"]))
    existing = {s["metadata"]["name"]: s for s in sets["items"]}
    for sts in existing.values():  # its count is the scaler's before a render omits it
        if not owns_replicas(sts, SCALE_MANAGER):
            take_replicas(kube, namespace, sts["metadata"]["name"], replicas_of(sts))
    start = start_replicas(deployment)
    counts = {r: None if role_object(name, r) in existing else n for r, n in start.items()}
    manifests = render(model, deployment, str(meta["uid"]), settings, counts)
    for manifest in manifests:
        kube.apply(manifest, FIELD_MANAGER)
    for role, n in counts.items():
        if n is not None:  # a new StatefulSet: from now on its count is the scaler's
            take_replicas(kube, namespace, role_object(name, role), n)
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
    """Apply again: whatever was edited or deleted by hand comes back as rendered (not for a card
    being deleted: its children are going)."""
    if body.metadata.get("deletionTimestamp"):
        return
    _write(patch, reconcile(body, memo) or {})


def _events(body: kopf.Body) -> Events:
    """Actions as Kubernetes Events on the card (and log lines)."""

    def post(reason: str, message: str, kind: str) -> None:
        logger.info("%s/%s: %s: %s", body.metadata.namespace, body.metadata.name, reason, message)
        kopf.event(body, type=kind, reason=reason, message=message)

    return post


def _record(body: kopf.Body) -> FleetRecord:
    """The record the last operator persisted (an unreadable one starts afresh, said in the log)."""
    text = (body.get("status") or {}).get("fleetRecord")
    if not text:
        return FleetRecord()
    try:
        return FleetRecord.from_json(str(text))
    except RecordError as exc:
        logger.warning("%s: starting from an empty fleet record: %s", body.metadata.name, exc)
        return FleetRecord()


@kopf.index(GROUP, VERSION, "modelcards")
def model_cards(body: kopf.Body, **_: Any) -> dict[tuple[str, str], Obj]:
    """Every ModelCard by (namespace, name), kept current by kopf's watch: a fleet round reads
    its ModelCard from here instead of asking the API server each time."""
    return {(str(body.metadata.namespace), str(body.metadata.name)): _document(body)}


@kopf.daemon(GROUP, VERSION, "deploymentcards", cancellation_timeout=10.0)
async def run_fleet(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **kwargs: Any
) -> None:
    """The fleet controller of one card, round after round while the card exists: failover,
    weight sync and routing of its pods, and its status (Ready only once every pod of the
    current revision serves the target version)."""
    kube: Kube = memo.kube
    index: kopf.Index[tuple[str, str], Obj] = kwargs["model_cards"]
    namespace, name = str(body.metadata.namespace), str(body.metadata.name)
    events = _events(body)
    fleet = PodFleet(kube, namespace, name, _record(body), events)
    metrics: OperatorMetrics | None = getattr(memo, "metrics", None)
    scaler = CardScaler(kube, namespace, name, events, metrics)
    written: dict[str, Any] = {}
    try:
        while not stopped:
            docs: Iterable[Obj] = index.get((namespace, str(body.spec.get("modelCard", ""))), [])
            model_doc = next(iter(docs), None)
            try:
                delay = await _fleet_round(kube, body, model_doc, fleet, scaler, written)
            except KubeError as exc:  # e.g. the Secret not made yet; the next round retries
                level = logging.DEBUG if exc.status == 404 else logging.WARNING
                logger.log(level, "%s/%s: fleet round failed: %s", namespace, name, exc)
                delay = ROUND_S
            waiter = asyncio.ensure_future(fleet.wake.wait())
            try:
                await asyncio.wait({waiter}, timeout=delay)
            finally:  # also when kopf cancels the daemon
                waiter.cancel()
            fleet.wake.clear()
    finally:
        await fleet.close()
        await scaler.close()
        if metrics is not None:  # a card that is gone (or no longer ours) takes its series along
            metrics.forget(namespace, name, ("prefill", "decode", "aggregated"))


async def _fleet_round(
    kube: Kube,
    body: kopf.Body,
    model_doc: Obj | None,
    fleet: PodFleet,
    scaler: CardScaler,
    written: dict[str, Any],
) -> float:
    """One round; the time to the next."""
    status = body.get("status") or {}
    if status.get("phase") == "Invalid":
        return IDLE_ROUND_S  # until the spec (or its ModelCard) changes and is judged again
    cards = load_cards(model_doc, body)
    if isinstance(cards, str):
        return IDLE_ROUND_S
    model, deployment = cards
    namespace, selector = fleet.namespace, f"{DEPLOYMENT_LABEL}={fleet.name}"
    sets = await asyncio.to_thread(
        kube.get, object_path("StatefulSet", namespace), labelSelector=selector
    )
    if claim_change(model, deployment, sets["items"]):
        return IDLE_ROUND_S  # no sync to a claim the pods lack; the handler says why (Valid)
    desired = desired_fleet(model, deployment)
    now = time.time()
    generation = int(body.metadata.get("generation") or 0)
    desired, counts, r = await scaler.round(fleet, desired, deployment, generation, now)
    rec = r.reconciliation
    by_name = {s["metadata"]["name"]: s for s in sets["items"]}
    base = deployment_status(deployment, generation, by_name, r.pods, counts)
    # What this daemon wrote last is the newest status it knows; the body's copy can trail it
    # by a watch event (or a whole re-list), and an old one would forget a lost capacity.
    previous = written or status
    fresh = with_fleet(
        base, rec.conditions, rec.record, desired.component, desired.weights_version, generation,
        previous,
    )  # fmt: skip
    if scaler.condition is not None:
        fresh["conditions"].append(dict(scaler.condition))
    fresh["conditions"] = with_transition_times(
        fresh["conditions"], previous.get("conditions") or []
    )
    if fresh != written:  # persisted before acting: a restarted operator resumes from here
        path = object_path("DeploymentCard", namespace, fleet.name, "status")
        await asyncio.to_thread(kube.patch, path, {"status": fresh})
        written.clear()
        written.update(fresh)
    await fleet.execute(r, desired)
    await scaler.follow(counts, r, by_name)
    acted = any(not isinstance(a, SetCondition) for a in rec.actions)
    delay = BUSY_ROUND_S if acted or fleet.busy else ROUND_S
    if rec.wake_at is not None:
        delay = min(delay, max(0.0, rec.wake_at - time.time()))
    return delay
