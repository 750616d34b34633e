"""What the operator knows of Loom's own objects from kopf's watches: indexes of the pods,
StatefulSets, RoleScales and every other rendered kind, by the card that owns them (label
`loom.dev/deployment`), and the wake-up of that card's loop when one of them changes.

Owns these kopf indexes and event handlers; never decides what a change means (round_inputs.py,
drift.py) and never writes. Objects without Loom's label are filtered out by kopf, so the
indexes' memory follows Loom's objects only; managedFields are dropped (but the scaler's own
entry of a StatefulSet, which says it owns spec.replicas); a pod's spec keeps only its
containers' ports (what `pod_worker` reads of it), a StatefulSet's pod template only its volumes
(what `claim_change` reads of it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from loom_operator.k8s.drift import marker
from loom_operator.k8s.kube import RESOURCES
from loom_operator.k8s.labels import GROUP, SCALE_MANAGER, VERSION
from loom_operator.k8s.wakers import CardWakers
from loom_runtime.wire.pods import DEPLOYMENT_LABEL

Obj = Mapping[str, Any]
Key = tuple[str, str]
LOOM = {DEPLOYMENT_LABEL: kopf.PRESENT}

ROUND_KINDS = {"Pod": "card_pods", "StatefulSet": "card_statefulsets",
               "RoleScale": "card_rolescales"}  # fmt: skip
"""Kinds a fleet round reads, with the name of their index (a handler's keyword argument)."""
MARKED_KINDS = ("ConfigMap", "Service", "ServiceAccount", "Role", "RoleBinding", "Deployment",
                "PodDisruptionBudget", "NetworkPolicy", "Secret")  # fmt: skip
"""Other kinds the operator writes (the rendered ones and the token Secret): only (kind, name,
drift marker) is kept (`marker_index(kind)`), never a Secret's data."""


def card_key(body: Obj) -> Key | None:
    """(namespace, card) of an object carrying Loom's deployment label."""
    meta = body.get("metadata") or {}
    card = (meta.get("labels") or {}).get(DEPLOYMENT_LABEL)
    return None if not card else (str(meta.get("namespace", "")), str(card))


def slim(body: Obj) -> dict[str, Any]:
    """The object as a plain dict without its managedFields (but the scaler's own)."""
    meta = dict(body.get("metadata") or {})
    fields = [f for f in meta.pop("managedFields", None) or [] if f.get("manager") == SCALE_MANAGER]
    if fields:
        meta["managedFields"] = fields
    return {**body, "metadata": meta}


def slim_pod(body: Obj) -> dict[str, Any]:
    """A pod as `slim` keeps it, its spec cut to its containers' names and ports."""
    spec = body.get("spec") or {}
    containers = [{"name": c.get("name"), "ports": c.get("ports") or []}
                  for c in spec.get("containers") or []]  # fmt: skip
    return {**slim(body), "spec": {"containers": containers}}


def slim_statefulset(body: Obj) -> dict[str, Any]:
    """A StatefulSet as `slim` keeps it, its pod template cut to the template's volumes."""
    spec = dict(body.get("spec") or {})
    volumes = ((spec.pop("template", None) or {}).get("spec") or {}).get("volumes") or []
    return {**slim(body), "spec": {**spec, "template": {"spec": {"volumes": volumes}}}}


KEPT = {"Pod": slim_pod, "StatefulSet": slim_statefulset}
"""What an index keeps of the kinds a round reads in full (other kinds: `slim`)."""


def items(index: Mapping[Key, Iterable[Any]] | None, key: Key) -> list[Any]:
    """The card's entries in one index (none when the index is absent or holds none)."""
    if index is None:
        return []
    return list(index.get(key, []))


@dataclass(frozen=True)
class CardCache:
    """What the watch caches hold for one card, read once per call."""

    model_doc: Obj | None
    """Its ModelCard document (None: not in the cache)."""
    statefulsets: list[dict[str, Any]]
    markers: dict[tuple[str, str], str]
    """(kind, name) -> drift marker of each of its rendered objects the cache holds."""


def card_cache(kwargs: Mapping[str, Any], card: Obj) -> CardCache:
    """The card's objects from the indexes kopf hands every handler (`kwargs`)."""
    meta = card["metadata"]
    key = (str(meta["namespace"]), str(meta["name"]))
    model = (card.get("spec") or {}).get("modelCard", "")
    docs = items(kwargs.get("model_cards"), (key[0], str(model)))
    sets = items(kwargs.get(ROUND_KINDS["StatefulSet"]), key)
    markers = {("StatefulSet", str(s["metadata"]["name"])): marker(s) for s in sets}
    for obj in items(kwargs.get(ROUND_KINDS["RoleScale"]), key):
        markers[("RoleScale", str(obj["metadata"]["name"]))] = marker(obj)
    for kind in MARKED_KINDS:
        for k, name, mark in items(kwargs.get(marker_index(kind)), key):
            markers[(k, name)] = mark
    return CardCache(docs[0] if docs else None, sets, markers)


def _wakers(memo: kopf.Memo) -> CardWakers | None:
    return getattr(memo, "wakers", None)


def _resource(kind: str) -> tuple[str, ...]:
    """kopf's resource spec of a kind (core kinds by plural alone)."""
    prefix, plural = RESOURCES[kind]
    if prefix == "/api/v1":
        return (plural,)
    _, _, group, version = prefix.split("/")
    return group, version, plural


def _indexer(kind: str, full: bool) -> Any:
    keep = KEPT.get(kind, slim)

    async def index(body: kopf.Body, **_: Any) -> dict[Key, Any]:
        key = card_key(body)
        if key is None:
            return {}
        return {key: keep(body) if full else (kind, str(body.metadata.name), marker(body))}

    return index


async def _changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    key, wakers = card_key(body), _wakers(memo)
    if key is not None and wakers is not None:
        wakers.wake(key)


def _register() -> None:
    for kind, name in ROUND_KINDS.items():
        resource = _resource(kind)
        kopf.index(*resource, id=name, labels=LOOM)(_indexer(kind, True))
        kopf.on.event(*resource, id=f"wake_{resource[-1]}", labels=LOOM)(_changed)
    for kind in MARKED_KINDS:
        resource = _resource(kind)
        kopf.index(*resource, id=marker_index(kind), labels=LOOM)(_indexer(kind, False))


def marker_index(kind: str) -> str:
    """The name of the index of a MARKED_KINDS kind."""
    return f"markers_{RESOURCES[kind][1]}"


_register()


@kopf.on.event(GROUP, VERSION, "modelcards")
async def wake_model_users(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A ModelCard changed: its namespace's card loops look again (rare; most see no change)."""
    wakers = _wakers(memo)
    if wakers is not None:
        wakers.wake_namespace(str(body.metadata.namespace))
