"""Whether a rendered object must be applied again: only when the render changed since the
operator last applied it, or the object as the watch cache holds it is no longer what that apply
left (edited by hand, deleted, never applied by this process).

Pure over plain data: an object's marker (its metadata.generation and labels where the API
server keeps a generation, so status writes are not drift; else its resourceVersion) and the
record of what this
process applied; never applies or reads anything (reconcile.py applies; card_loop.py says when).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loom_operator.k8s.round_inputs import digest

Obj = Mapping[str, Any]
Key = tuple[str, str, str, str]
"""(namespace, kind, name, uid of the card that rendered it)."""

REAPPLY_INTERVAL_S = 30.0
"""How often a card's loop applies its rendered objects again, correcting drift."""


def reapply_due(applied_at: float, now: float, interval: float = REAPPLY_INTERVAL_S) -> bool:
    """Whether a card last applied at `applied_at` is applied again now (same clock)."""
    return now - applied_at >= interval


def marker(obj: Obj) -> str:
    """What changes when an object's desired state is written: its generation and its labels
    where the API server keeps a generation (status writes leave them; a label edit leaves the
    generation), else its resourceVersion. Not its annotations: the operator renders none, and
    controllers write theirs (a Deployment's revision)."""
    meta = obj.get("metadata") or {}
    generation = meta.get("generation")
    if generation is None:
        return f"r{meta.get('resourceVersion', '')}"
    return f"g{generation}:{digest(meta.get('labels') or {})[:16]}"


def render_digest(manifest: Obj) -> str:
    """The digest of a render, without a StatefulSet's spec.replicas (the start count a new one
    is rendered with; from then on the count is the scaler's, and the render omits it)."""
    if manifest.get("kind") == "StatefulSet" and "replicas" in (manifest.get("spec") or {}):
        spec = {k: v for k, v in manifest["spec"].items() if k != "replicas"}
        return digest({**manifest, "spec": spec})
    return digest(manifest)


def key_of(manifest: Obj, card_uid: str) -> Key:
    meta = manifest["metadata"]
    return str(meta["namespace"]), str(manifest["kind"]), str(meta["name"]), card_uid


ObjectKey = tuple[str, str, str]
"""(namespace, kind, name)."""


@dataclass
class Applied:
    """What this process applied, per object: the card that rendered it, the render's digest and
    the marker the apply left. One per operator (in kopf's memo), shared by kopf's handler
    threads and the card loops' (its writes are locked); a card's entries go with the card.
    Each call is O(1) in the objects held (a card's `forget`: in its own objects)."""

    _seen: dict[ObjectKey, tuple[str, str, str]] = field(default_factory=dict)
    """(namespace, kind, name) -> (card uid, render digest, marker)."""
    _objects: dict[tuple[str, str], set[ObjectKey]] = field(default_factory=dict)
    """(namespace, card uid) -> the objects recorded for it."""
    _secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """(namespace, card uid) -> the data of the token Secret this process made or found."""
    _cards: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    """(namespace, card uid) -> the (generation, ModelCard digest) this process last applied."""
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def needs_apply(self, key: Key, manifest: Obj, live: str | None) -> bool:
        """Apply unless the same render was applied for the same card and the cache's object
        (`live`: its marker, None when the cache does not hold it) is still what that apply
        left."""
        last = self._seen.get(key[:3])
        if last is None or live is None or last[0] != key[3]:
            return True
        return last[1:] != (render_digest(manifest), live)

    def record(self, key: Key, manifest: Obj, result: Obj) -> None:
        namespace, kind, name, uid = key
        with self._lock:
            self._seen[(namespace, kind, name)] = (uid, render_digest(manifest), marker(result))
            self._objects.setdefault((namespace, uid), set()).add((namespace, kind, name))

    def wrote(self, namespace: str, kind: str, name: str, result: Obj) -> None:
        """This process wrote an object it renders another way (the scaler's replicas): what
        that write left is no drift."""
        with self._lock:
            last = self._seen.get((namespace, kind, name))
            if last is not None:
                self._seen[(namespace, kind, name)] = (last[0], last[1], marker(result))

    def secret_needed(self, namespace: str, card_uid: str, live: str | None) -> bool:
        """The card's token Secret is to be made (or found made): once per process, and again
        when the cache (`live`: its marker, None when it does not hold it) lost it."""
        return (namespace, card_uid) not in self._secrets or live is None

    def secret_data(self, namespace: str, card_uid: str) -> dict[str, str] | None:
        """The tokens of the card's Secret as this process made or found them (None: neither)."""
        return self._secrets.get((namespace, card_uid))

    def secret_made(self, namespace: str, card_uid: str, data: dict[str, str]) -> None:
        with self._lock:
            self._secrets[(namespace, card_uid)] = data

    def card_applied(self, namespace: str, card_uid: str, at: tuple[int, str]) -> None:
        """The card was rendered and applied (or judged invalid) at (generation, ModelCard
        digest)."""
        self._cards[(namespace, card_uid)] = at

    def card_lock(self, namespace: str, card_uid: str) -> threading.Lock:
        """Held while the card is reconciled (kopf's handler threads and its loop)."""
        return self._locks.setdefault((namespace, card_uid), threading.Lock())

    def card_at(self, namespace: str, card_uid: str) -> tuple[int, str] | None:
        """What `card_applied` last said of the card (None: not applied by this process)."""
        return self._cards.get((namespace, card_uid))

    def forget(self, namespace: str, card_uid: str) -> None:
        """A card that is gone (or acted on by another replica now) takes its entries along."""
        with self._lock:
            self._cards.pop((namespace, card_uid), None)
            self._locks.pop((namespace, card_uid), None)
            for obj in self._objects.pop((namespace, card_uid), set()):
                if self._seen.get(obj, ("",))[0] == card_uid:  # not a new card's since
                    del self._seen[obj]
            self._secrets.pop((namespace, card_uid), None)
