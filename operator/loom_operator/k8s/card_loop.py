"""One DeploymentCard's loop on the replica that runs it: the card applied when this replica takes
it, its workers looked at when a watch says something of the card changed (and at least every
PROBE_S), a fleet round run only when what it reads changed or its time has come, and the card's
objects applied again every REAPPLY_INTERVAL_S (drift correction).

Owns a card's fleet, scaler and the status it wrote while the supervisor (card_supervisor.py)
keeps its task; never decides which cards run here (the supervisor does) and never runs for a
card whose shard this replica does not hold (each look asks the shards first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.fleet.actions import SetCondition
from loom_operator.fleet.desired import desired_fleet
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.record import FleetRecord, RecordError
from loom_operator.k8s.card_supervisor import CardRef, shards_of
from loom_operator.k8s.drift import Applied, reapply_due
from loom_operator.k8s.fleet import Events, PodFleet
from loom_operator.k8s.kube import Kube, KubeError, object_path
from loom_operator.k8s.metrics import OperatorMetrics
from loom_operator.k8s.pushes import CardPushes, PushDesks
from loom_operator.k8s.reconcile import load_cards, reconcile, write_status
from loom_operator.k8s.render.model_volumes import claim_change
from loom_operator.k8s.round_inputs import (
    MIN_LOOK_S,
    PROBE_S,
    RoundInputs,
    digest,
    look_delay,
    next_due,
    object_versions,
    round_due,
    round_inputs,
)
from loom_operator.k8s.scaler import CardScaler
from loom_operator.k8s.status import deployment_status, with_fleet, with_transition_times
from loom_operator.k8s.wakers import CardWakers
from loom_operator.k8s.watched import ROUND_KINDS, card_cache, items
from loom_runtime.card.model_card import ModelCard

logger = logging.getLogger(__name__)

CARDS_INDEX = "deployment_cards"
"""kopf's index of every DeploymentCard by (namespace, name) (handlers.py keeps it)."""
Obj = Mapping[str, Any]
ROLES = ("prefill", "decode", "aggregated")
"""The roles whose metric series a card takes along when its loop ends."""


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


@dataclass
class CardLoop:
    """What one card's loop remembers between looks while this replica acts on the card."""

    fleet: PodFleet
    scaler: CardScaler
    pushes: CardPushes
    inputs: RoundInputs | None = None
    """The inputs of the last round (None: none yet)."""
    due_at: float | None = None
    """When a round must run even if nothing changes."""
    written: dict[str, Any] = field(default_factory=dict)
    """The status this loop wrote last."""
    cards: tuple[tuple[int, str], tuple[ModelCard, DeploymentCard] | str] | None = None
    """The cards parsed at (generation, ModelCard digest)."""
    applied_at: float = field(default_factory=time.monotonic)
    """When the card's objects were last applied by this loop (time.monotonic(); taking the card
    applies it)."""

    async def close(self) -> None:
        await self.pushes.close()
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
    pushes = CardPushes(fleet, events, wake.set, body.get("status") or {})
    desks: PushDesks | None = getattr(memo, "push_desks", None)
    if desks is not None:
        desks.cards[(namespace, name)] = pushes
    return CardLoop(fleet, CardScaler(kube, namespace, name, events, metrics, applied), pushes)


def current(indexes: Mapping[str, Any], ref: CardRef) -> kopf.Body | None:
    """The card as kopf's watch last saw it (None: gone, or its name now another card's)."""
    for card in items(indexes.get(CARDS_INDEX), (ref.namespace, ref.name)):
        if str(card["metadata"]["uid"]) == ref.uid:
            return kopf.Body(card)
    return None


async def run_card(
    ref: CardRef, memo: kopf.Memo, indexes: Mapping[str, Any], stop: asyncio.Event
) -> None:
    """The card's loop until `stop` (the supervisor sets it: the card is gone, or its shard went
    to another replica). It looks at its workers when a watch says something of the card
    changed, at the core's or the planner's time, and at least every PROBE_S (the probes); a
    round (failover, weight sync and routing of its pods, and its status) runs only when what it
    reads changed or its time has come; every REAPPLY_INTERVAL_S the card is applied again. A
    look while the shard is not held (its Lease lapsed) acts on nothing."""
    key = (ref.namespace, ref.name)
    wakers: CardWakers = getattr(memo, "wakers", None) or CardWakers()
    wake = wakers.event(key)
    metrics: OperatorMetrics | None = getattr(memo, "metrics", None)
    applied: Applied | None = getattr(memo, "applied", None)
    shards = shards_of(memo)
    loop: CardLoop | None = None
    try:
        while not stop.is_set():
            wake.clear()
            looked, delay = time.time(), PROBE_S
            body = current(indexes, ref)
            with shards.acting(ref.uid) as mine:
                if mine and body is not None:
                    loop = loop or _take(body, memo, wake)
                    await _look_safely(body, memo, indexes, loop, metrics)
                    delay = look_delay(loop.due_at, looked, time.time())
            await asyncio.sleep(max(0.0, MIN_LOOK_S - (time.time() - looked)))
            waiters = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait())}
            try:
                await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:  # also when the loop is cancelled
                for waiter in waiters:
                    waiter.cancel()
    finally:
        wakers.forget(key)
        desks: PushDesks | None = getattr(memo, "push_desks", None)
        if desks is not None and loop is not None and desks.cards.get(key) is loop.pushes:
            del desks.cards[key]
        if applied is not None:
            applied.forget(ref.namespace, ref.uid)
        if loop is not None:
            await loop.close()
        if metrics is not None:  # a card that is gone (or no longer ours) takes its series along
            metrics.forget(ref.namespace, ref.name, ROLES)


async def _look_safely(
    body: kopf.Body,
    memo: kopf.Memo,
    indexes: Mapping[str, Any],
    loop: CardLoop,
    metrics: OperatorMetrics | None,
) -> None:
    try:
        if reapply_due(loop.applied_at, time.monotonic()):
            await _reapply(body, memo, indexes, loop)
        await _look(memo, body, indexes, loop, metrics)
    except KubeError as exc:  # e.g. the Secret not made yet; the next look retries
        level = logging.DEBUG if exc.status == 404 else logging.WARNING
        logger.log(level, "%s/%s: fleet round failed: %s", loop.fleet.namespace, loop.fleet.name,
                   exc)  # fmt: skip
        loop.inputs, loop.due_at = None, None  # again at the next watch or PROBE_S


async def _reapply(
    body: kopf.Body, memo: kopf.Memo, indexes: Mapping[str, Any], loop: CardLoop
) -> None:
    """Apply again what differs from the watch cache: whatever was edited or deleted by hand
    comes back as rendered."""
    loop.applied_at = time.monotonic()  # a failed apply is tried again at the next interval
    fields = await asyncio.to_thread(reconcile, body, memo, card_cache(indexes, body), True)
    await asyncio.to_thread(write_status, memo.kube, body, fields)


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
    """Apply the cards if they changed since this loop last did; probe the card's workers;
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
        await asyncio.to_thread(write_status, kube, body, fields)
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
    inputs = round_inputs(
        generation, phase, model_doc, objects, seen[0], fleet.busy, loop.pushes.inputs
    )
    if not round_due(loop.inputs, inputs, due_at, now):
        loop.due_at = due_at
        return
    loop.inputs = inputs
    acted, wake_at = await _fleet_round(kube, body, (model, deployment), seen, sets, scales, loop)
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
    loop: CardLoop,
) -> tuple[bool, float | None]:
    """One round over what the look saw: whether it acted on workers, and the core's wake_at.
    The fleet serves the card's weights version, or a trainer's push every worker staged."""
    model, deployment = cards
    fleet, scaler, pushes, written = loop.fleet, loop.scaler, loop.pushes, loop.written
    status = body.get("status") or {}
    card = desired_fleet(model, deployment)
    now = seen[0].now
    generation = int(body.metadata.get("generation") or 0)
    desired, counts, r = await scaler.round(
        fleet, seen, scales, pushes.coordinator.desired(card), deployment, generation, now
    )
    rec = r.reconciliation
    by_name = {s["metadata"]["name"]: s for s in sets}
    base = deployment_status(deployment, generation, by_name, r.pods, counts)
    # What this loop wrote last is the newest status it knows; the body's copy can trail it
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
    fresh.update(pushes.status())
    if fresh != written:  # persisted before acting: a restarted operator resumes from here
        path = object_path("DeploymentCard", fleet.namespace, fleet.name, "status")
        await asyncio.to_thread(kube.patch, path, {"status": fresh})
        written.clear()
        written.update(fresh)
    await fleet.execute(r, desired)
    await scaler.follow(counts, r, by_name)
    at_counts = card.with_replicas(counts)  # the card's version, at the workers it runs
    pushes.coordinator.follow(at_counts, seen[0], rec.record.sync)
    pushes.seen(at_counts, seen[0], rec.record.sync)
    acted = any(not isinstance(a, SetCondition) for a in rec.actions)
    return acted, rec.wake_at
