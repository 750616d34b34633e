"""A trainer's weight push as the fleet controller sees it: when one may open, what the fleet
is asked to serve once every worker has staged it, and when it is done.

Owns the rules of a push (one open at a time, every worker ready, the mode's strategy); never
moves a byte or calls a worker (the substrate's shell does), and never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

from loom_operator.api.status import PushMode, PushState
from loom_operator.fleet.desired import DesiredFleet, Strategy
from loom_operator.fleet.observed import FleetObservation
from loom_operator.fleet.record import SyncRecord
from loom_runtime.wire.push import PUSH_SCHEME

MODE_STRATEGY: dict[str, Strategy] = {"barrier": "Barrier", "rolling": "Rolling", "keep": "Keep"}
"""A push's mode -> the weight-sync strategy that swaps it in (the existing lifecycle)."""
PUSH_STATES: tuple[PushState, ...] = ("receiving", "swapping", "done", "failed")
KV_POLICIES = ("keep", "recompute")
"""Mode keep: what a running request does with the KV of the old weights (runtime's keep_swap)."""


class PushConflict(Exception):
    """A push may not open now; the message says why and what to do."""


@dataclass(frozen=True)
class PushUpdate:
    """One push, from open to done or failed."""

    update_id: str
    version: str
    mode: PushMode
    workers: tuple[str, ...]
    """Every desired worker, in rank order (worker i is rank i + 1; the trainer is rank 0)."""
    store_host: str
    store_port: int
    timeout_s: float
    base_version: str
    """The card's weightsVersion when the push opened: a card edit since then wins over it."""
    state: PushState = "receiving"
    error: str = ""
    staged: frozenset[str] = frozenset()
    kv: str = ""
    """Mode keep: keep | recompute (the running requests' KV); "" for the other modes."""

    @property
    def open(self) -> bool:
        return self.state in ("receiving", "swapping")

    @property
    def source(self) -> str:
        return f"{PUSH_SCHEME}{self.update_id}"

    def as_json(self) -> dict[str, object]:
        return {
            "update_id": self.update_id, "version": self.version, "mode": self.mode,
            "workers": list(self.workers), "store_host": self.store_host,
            "store_port": self.store_port, "timeout_seconds": self.timeout_s,
            "state": self.state, "error": self.error, "staged": sorted(self.staged),
            "base_version": self.base_version, "kv": self.kv,
        }  # fmt: skip

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> PushUpdate:
        """The inverse of as_json (a persisted push); ValueError when a field is wrong."""
        mode, state = doc.get("mode"), doc.get("state")
        workers, staged = doc.get("workers"), doc.get("staged")
        if mode not in MODE_STRATEGY or state not in PUSH_STATES:
            raise ValueError(f"not a persisted push: mode {mode!r}, state {state!r}")
        if not isinstance(workers, list) or not isinstance(staged, list):
            raise ValueError("not a persisted push: workers and staged must be lists")
        try:
            return cls(
                str(doc["update_id"]), str(doc["version"]), cast(PushMode, mode),
                tuple(map(str, workers)), str(doc["store_host"]), int(str(doc["store_port"])),
                float(str(doc["timeout_seconds"])), str(doc["base_version"]),
                state, str(doc["error"]), frozenset(map(str, staged)), str(doc.get("kv", "")),
            )  # fmt: skip
        except KeyError as exc:
            raise ValueError(f"not a persisted push: no {exc}") from exc


def refuse_push(
    desired: DesiredFleet,
    observed: FleetObservation,
    sync: SyncRecord | None,
    current: PushUpdate | None,
    version: str,
    mode: str,
    kv: str = "",
) -> str | None:
    """Why a push of `version` in `mode` (`kv`: mode keep's KV policy) may not open now (None:
    it may)."""
    if mode not in MODE_STRATEGY:
        return f"mode must be one of {', '.join(MODE_STRATEGY)}, got {mode!r}"
    why = _refuse_kv(mode, kv)
    if why is not None:
        return why
    if not version:
        return "a push needs a version"
    if current is not None and current.open:
        return (
            f"push {current.update_id} of {current.version} is still {current.state}: one "
            "trainer pushes at a time; retry once it is done or failed"
        )
    if sync is not None and sync.active:
        return f"a weight sync to {sync.target_version} is in progress; retry once it is done"
    versions = {w.weights_version for w in observed.workers}
    if version == desired.weights_version or version in versions:
        return f"the fleet already has weights version {version!r}: give each push a new version"
    not_ready = []
    for slot in desired.slots:
        w = observed.get(slot.name)
        if w is None or not w.healthy:
            not_ready.append(f"{slot.name} (not running or not answering)")
        elif w.weights_version is None or not w.routable:
            not_ready.append(f"{slot.name} (starting, paused or draining)")
    if not_ready:
        return (
            f"every worker must be ready for a push; not ready: {', '.join(not_ready)}; retry "
            "once `loom status` shows them serving"
        )
    return None


def _refuse_kv(mode: str, kv: str) -> str | None:
    if mode != "keep":
        return None if not kv else f"kv is mode keep's option; mode {mode} drains, got kv {kv!r}"
    if kv not in KV_POLICIES:
        return f"kv must be one of {', '.join(KV_POLICIES)} for mode keep, got {kv!r}"
    return None


def pushed_desired(desired: DesiredFleet, push: PushUpdate | None) -> DesiredFleet:
    """What the fleet should serve: the pushed version (swapped in by the mode's strategy) once
    every worker has staged it, unless the card's weightsVersion changed since it opened."""
    if push is None or push.state not in ("swapping", "done"):
        return desired
    if desired.weights_version != push.base_version:
        return desired
    sync = replace(desired.sync, strategy=MODE_STRATEGY[push.mode], kv=push.kv)
    return replace(desired, weights_version=push.version, source_uri=push.source, sync=sync)


def swap_done(desired: DesiredFleet, observed: FleetObservation, sync: SyncRecord | None) -> bool:
    """Every desired worker serves `desired.weights_version` and no sync is active."""
    if sync is not None and sync.active:
        return False
    for slot in desired.slots:
        w = observed.get(slot.name)
        if w is None or w.weights_version != desired.weights_version or not w.routable:
            return False
    return True
