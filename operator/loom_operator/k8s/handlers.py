"""The kopf handlers, one concern each: ModelCards are validated; a DeploymentCard is
rendered, applied (server-side apply, one field manager, only what drifted from the watch cache)
and its status kept true to what runs, by a daemon that looks when a watch (watched.py) says
something of the card changed and runs a fleet round only when what it reads changed.

Owns the operator's I/O with the API server; decisions are the renderers', status.py's,
round_inputs.py's and drift.py's. Handlers find their settings, client, wake-ups and record of
applies in kopf's `memo` (no module-level state).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.api.documents import parse_documents
from loom_operator.api.roles import RoleName
from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.desired import desired_fleet
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.record import FleetRecord, RecordError
from loom_operator.k8s.drift import Applied, key_of
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
from loom_operator.k8s.round_inputs import (
    MIN_LOOK_S,
    RoundInputs,
    digest,
    look_delay,
    next_due,
    object_versions,
    round_due,
    round_inputs,
)
from loom_operator.k8s.scale_status import owns_replicas
from loom_operator.k8s.scaler import CardScaler, replicas_of, take_replicas
from loom_operator.k8s.settings import RenderSettings
from loom_operator.k8s.shard_keeper import Shards
from loom_operator.k8s.status import deployment_status, with_fleet, with_transition_times
from loom_operator.k8s.wakers import CardWakers
from loom_operator.k8s.watched import ROUND_KINDS, CardCache, card_cache, items
from loom_runtime.card.errors import CardError
from loom_runtime.card.model_card import ModelCard
from loom_runtime.wire.pods import DEPLOYMENT_LABEL

logger = logging.getLogger(__name__)

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


@kopf.on.startup()
async def wake_on_shard_changes(memo: kopf.Memo, **_: Any) -> None:
    """A sharded replica's card daemons look again when the shards it holds change: the cards
    it took start acting at once, the cards it gave back stop."""
    shards: Shards | None = getattr(memo, "shards", None)
    wakers: CardWakers | None = getattr(memo, "wakers", None)
    if shards is not None and wakers is not None:
        loop = asyncio.get_running_loop()

        def wake() -> None:  # from the shard keeper's thread
            with contextlib.suppress(RuntimeError):  # kopf's loop closed: the operator stops
                loop.call_soon_threadsafe(wakers.wake_all)

        shards.on_change(wake)


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
def validate_model_card(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any) -> None:
    """A ModelCard's own rules (every error with its field path) into `Valid`; the
    DeploymentCards that serve it are rendered again."""
    try:
        parse_documents([(0, _document(body))], str(body.metadata.name))
        problem = None
    except CardError as exc:
        problem = _problems(exc)
    shards = _shards(memo)
    with shards.acting(str(body.metadata.uid)) as mine:
        if mine:
            _write(patch, validity(body, problem))
    kube: Kube = memo.kube
    namespace = str(body.metadata.namespace)
    for card in kube.get(object_path("DeploymentCard", namespace))["items"]:
        if card["spec"].get("modelCard") != body.metadata.name:
            continue
        with shards.acting(str(card["metadata"]["uid"])) as mine:
            if mine:
                _write_status(kube, card, reconcile(card, memo, card_cache(kwargs, card)))


def _shards(memo: kopf.Memo) -> Shards:
    """The cards this replica acts on (every card when the operator is not sharded)."""
    shards: Shards | None = getattr(memo, "shards", None)
    return shards if shards is not None else Shards()


def _write_status(kube: Kube, card: Obj, fields: Mapping[str, Any] | None) -> None:
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
        cards = parse_documents([(0, model_doc), (1, _document(card))], namespace)
    except CardError as exc:
        return _problems(exc)
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
        return _document(kube.get(object_path("ModelCard", namespace, str(model_name))))
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
    handler and the card's daemon both ask after a change: the second finds it done)."""
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
    if applied.secret_needed(namespace, uid):
        _ensure_secret(kube, namespace, name, uid)
        applied.secret_made(namespace, uid)
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
def apply_deployment_card(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any
) -> None:
    with _shards(memo).acting(str(body.metadata.uid)) as mine:
        if mine:  # else the replica holding its shard applies it (its daemon, on taking it)
            _write(patch, reconcile(body, memo, card_cache(kwargs, body)) or {})


@kopf.timer(GROUP, VERSION, "deploymentcards", interval=REAPPLY_INTERVAL_S,
            initial_delay=REAPPLY_INTERVAL_S)  # fmt: skip
def correct_drift(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any) -> None:
    """Apply again what differs from the watch cache: whatever was edited or deleted by hand
    comes back as rendered (not for a card being deleted: its children are going)."""
    if body.metadata.get("deletionTimestamp"):
        return
    with _shards(memo).acting(str(body.metadata.uid)) as mine:
        if mine:
            _write(patch, reconcile(body, memo, card_cache(kwargs, body), again=True) or {})


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


@dataclass
class CardLoop:
    """What one card's daemon remembers between looks while this replica acts on the card."""

    fleet: PodFleet
    scaler: CardScaler
    inputs: RoundInputs | None = None
    """The inputs of the last round (None: none yet)."""
    due_at: float | None = None
    """When a round must run even if nothing changes."""
    written: dict[str, Any] = field(default_factory=dict)
    """The status this daemon wrote last."""
    cards: tuple[tuple[int, str], tuple[ModelCard, DeploymentCard] | str] | None = None
    """The cards parsed at (generation, ModelCard digest)."""

    async def close(self) -> None:
        await self.fleet.close()
        await self.scaler.close()


def _take(body: kopf.Body, memo: kopf.Memo, wake: asyncio.Event) -> CardLoop:
    """This replica starts acting on the card: its fleet from the record the last owner left."""
    kube: Kube = memo.kube
    namespace, name = str(body.metadata.namespace), str(body.metadata.name)
    events = _events(body)
    metrics: OperatorMetrics | None = getattr(memo, "metrics", None)
    applied: Applied | None = getattr(memo, "applied", None)
    fleet = PodFleet(kube, namespace, name, _record(body), events, wake)
    return CardLoop(fleet, CardScaler(kube, namespace, name, events, metrics, applied))


@kopf.daemon(GROUP, VERSION, "deploymentcards", cancellation_timeout=10.0)
async def run_fleet(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **kwargs: Any
) -> None:
    """The fleet controller of one card while it exists and this replica holds its shard: it
    looks at its workers when a watch says something of the card changed, at the core's or the
    planner's time, and at least every PROBE_S (the probes); a round (failover, weight sync and
    routing of its pods, and its status) runs only when what it reads changed or its time has
    come. On a replica that does not hold the card's shard it waits, acting on nothing, until
    the shards change."""
    namespace, name, uid = (
        str(body.metadata.namespace), str(body.metadata.name), str(body.metadata.uid)
    )  # fmt: skip
    wakers: CardWakers = getattr(memo, "wakers", None) or CardWakers()
    wake = wakers.event((namespace, name))
    metrics: OperatorMetrics | None = getattr(memo, "metrics", None)
    applied: Applied | None = getattr(memo, "applied", None)
    shards = _shards(memo)
    loop: CardLoop | None = None
    try:
        while not stopped:
            wake.clear()
            looked, delay = time.time(), None
            with shards.acting(uid) as mine:
                if mine:
                    loop = loop or _take(body, memo, wake)
                    await _look_safely(body, memo, kwargs, loop, metrics)
                    delay = look_delay(loop.due_at, looked, time.time())
                elif loop is not None:  # its shard went to another replica: stop acting
                    logger.info("%s/%s: no longer in this replica's shards", namespace, name)
                    await loop.close()
                    loop = None
                    if applied is not None:
                        applied.forget(namespace, uid)
            await asyncio.sleep(max(0.0, MIN_LOOK_S - (time.time() - looked)))
            waiter = asyncio.ensure_future(wake.wait())
            try:
                await asyncio.wait({waiter}, timeout=delay)
            finally:  # also when kopf cancels the daemon
                waiter.cancel()
    finally:
        wakers.forget((namespace, name))
        if applied is not None:
            applied.forget(namespace, uid)
        if loop is not None:
            await loop.close()
        if metrics is not None:  # a card that is gone (or no longer ours) takes its series along
            metrics.forget(namespace, name, ("prefill", "decode", "aggregated"))


async def _look_safely(
    body: kopf.Body,
    memo: kopf.Memo,
    indexes: Mapping[str, Any],
    loop: CardLoop,
    metrics: OperatorMetrics | None,
) -> None:
    try:
        await _look(memo, body, indexes, loop, metrics)
    except KubeError as exc:  # e.g. the Secret not made yet; the next look retries
        level = logging.DEBUG if exc.status == 404 else logging.WARNING
        logger.log(level, "%s/%s: fleet round failed: %s", loop.fleet.namespace, loop.fleet.name,
                   exc)  # fmt: skip
        loop.inputs, loop.due_at = None, None  # again at the next watch or PROBE_S


def _cards(
    body: kopf.Body, model_doc: Obj | None, loop: CardLoop
) -> tuple[ModelCard, DeploymentCard] | str:
    """The cards parsed together, again only when the card's generation or its ModelCard changed."""
    at = (int(body.metadata.get("generation") or 0), digest(model_doc))
    if loop.cards is None or loop.cards[0] != at:
        loop.cards = (at, load_cards(model_doc, body))
    return loop.cards[1]


async def _look(
    memo: kopf.Memo,
    body: kopf.Body,
    indexes: Mapping[str, Any],
    loop: CardLoop,
    metrics: OperatorMetrics | None,
) -> None:
    """Apply the cards if they changed since this daemon last did; probe the card's workers;
    run a round when its inputs changed or its time has come. A card that cannot round
    (invalid, a claim change) waits for a watch: no round is due."""
    kube: Kube = memo.kube
    fleet, scaler = loop.fleet, loop.scaler
    key = (fleet.namespace, fleet.name)
    docs = items(indexes.get("model_cards"), (key[0], str(body.spec.get("modelCard", ""))))
    model_doc = docs[0] if docs else None
    applied: Applied | None = getattr(memo, "applied", None)
    applying = (int(body.metadata.get("generation") or 0), digest(model_doc))
    if applied is not None and applied.card_at(key[0], str(body.metadata.uid)) != applying:
        # kopf's handler did not apply this here: this replica just took the card, or another
        # replica's kopf bookkeeping marked the change handled first
        fields = await asyncio.to_thread(reconcile, body, memo, card_cache(indexes, body))
        await asyncio.to_thread(_write_status, kube, body, fields)
    status = body.get("status") or {}
    phase = status.get("phase")
    due_at, loop.due_at = loop.due_at, None
    if phase == "Invalid":
        return  # until the spec (or its ModelCard) changes and is judged again
    cards = _cards(body, model_doc, loop)
    if isinstance(cards, str):
        return
    model, deployment = cards
    sets = items(indexes.get(ROUND_KINDS["StatefulSet"]), key)
    if claim_change(model, deployment, sets):
        return  # no sync to a claim the pods lack; the handler says why (Valid)
    pods = items(indexes.get(ROUND_KINDS["Pod"]), key)
    scales = items(indexes.get(ROUND_KINDS["RoleScale"]), key)
    now = time.time()
    seen = await fleet.look(now, pods)
    generation = int(body.metadata.get("generation") or 0)
    objects = [*object_versions("Pod", pods), *object_versions("StatefulSet", sets),
               *object_versions("RoleScale", scales)]  # fmt: skip
    inputs = round_inputs(generation, phase, model_doc, objects, seen[0], fleet.busy)
    if not round_due(loop.inputs, inputs, due_at, now):
        loop.due_at = due_at
        return
    loop.inputs = inputs
    acted, wake_at = await _fleet_round(
        kube, body, (model, deployment), seen, sets, scales, fleet, scaler, loop.written
    )
    loop.due_at = next_due(acted or fleet.busy, wake_at, scaler.planner_at, time.time())
    if metrics is not None:
        metrics.round_done(fleet.namespace, acted)


async def _fleet_round(
    kube: Kube,
    body: kopf.Body,
    cards: tuple[ModelCard, DeploymentCard],
    seen: tuple[FleetObservation, list[dict[str, Any]]],
    sets: list[dict[str, Any]],
    scales: list[dict[str, Any]],
    fleet: PodFleet,
    scaler: CardScaler,
    written: dict[str, Any],
) -> tuple[bool, float | None]:
    """One round over what the look saw: whether it acted on workers, and the core's wake_at."""
    model, deployment = cards
    status = body.get("status") or {}
    desired = desired_fleet(model, deployment)
    now = seen[0].now
    generation = int(body.metadata.get("generation") or 0)
    desired, counts, r = await scaler.round(
        fleet, seen, scales, desired, deployment, generation, now
    )
    rec = r.reconciliation
    by_name = {s["metadata"]["name"]: s for s in sets}
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
        path = object_path("DeploymentCard", fleet.namespace, fleet.name, "status")
        await asyncio.to_thread(kube.patch, path, {"status": fresh})
        written.clear()
        written.update(fresh)
    await fleet.execute(r, desired)
    await scaler.follow(counts, r, by_name)
    acted = any(not isinstance(a, SetCondition) for a in rec.actions)
    return acted, rec.wake_at
