"""When a card's fleet round runs: only when something it depends on changed (the card's
generation or phase, its ModelCard, a pod, StatefulSet or RoleScale of the card, what the probes
and routers say of its workers) or a time the round asked for has come.

Pure: the inputs of one look as a comparable record, and the decisions over them; never reads a
clock, a cache or a socket (card_loop.py does, and calls these).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from loom_operator.fleet.observed import FleetObservation, WorkerState

PROBE_S = 2.0
"""Longest time between two looks at a card's workers (gRPC Status, /health, the routers): the
per-card probe budget while nothing changes."""
BUSY_S = 0.3
"""Time to the next round after one that acted on workers (a sync or failover in motion)."""
MIN_LOOK_S = 0.05
"""Shortest time between two looks (a burst of watch events costs one look, not one each)."""

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class RoundInputs:
    """Everything a fleet round reads, as one comparable record: equal inputs, equal round."""

    generation: int
    phase: str | None
    model: str
    """A digest of the ModelCard document ("" when it does not exist)."""
    objects: tuple[tuple[str, str, str], ...]
    """(kind, name, resourceVersion) of the card's pods, StatefulSets and RoleScales."""
    workers: tuple[WorkerState, ...]
    """The observed workers without their times of last answer (a healthy worker answers
    every look; the deadline its time implies is the core's `wake_at`)."""
    held_requests: int
    loading: bool
    push: tuple[str, str, int] = ("", "", 0)
    """The latest push's (id, state, workers staged): its transfer moving on runs a round."""


def digest(doc: Obj | None) -> str:
    """A stable digest of a JSON document ("" for None)."""
    if doc is None:
        return ""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def object_versions(kind: str, objects: Iterable[Obj]) -> list[tuple[str, str, str]]:
    """(kind, name, resourceVersion) of each object, sorted by name."""
    out = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        out.append((kind, str(meta.get("name", "")), str(meta.get("resourceVersion", ""))))
    return sorted(out)


def round_inputs(
    generation: int,
    phase: str | None,
    model_doc: Obj | None,
    objects: Iterable[tuple[str, str, str]],
    observed: FleetObservation,
    loading: bool,
    push: tuple[str, str, int] = ("", "", 0),
) -> RoundInputs:
    """The record of one look (`objects` from `object_versions`)."""
    workers = tuple(replace(w, last_seen=None) for w in observed.workers)
    return RoundInputs(generation, phase, digest(model_doc), tuple(sorted(objects)), workers,
                       observed.held_requests, loading, push)  # fmt: skip


def round_due(last: RoundInputs | None, now_inputs: RoundInputs, due_at: float | None,
              now: float) -> bool:  # fmt: skip
    """A round runs on the first look, when the inputs changed since the last round, and once
    the time it asked for (`due_at`: the core's wake_at, the planner's next decision, the
    follow-up of a round that acted) has come."""
    if last is None or last != now_inputs:
        return True
    return due_at is not None and now >= due_at


def next_due(
    acted: bool, wake_at: float | None, planner_at: float | None, now: float
) -> float | None:
    """When the next round must run even if nothing changes: soon after a round that acted (its
    effects show in the probes), at the core's wake_at, at the planner's next decision."""
    times = [t for t in (now + BUSY_S if acted else None, wake_at, planner_at) if t is not None]
    return min(times, default=None)


def look_delay(due_at: float | None, last_look: float, now: float) -> float:
    """Seconds to wait for a watch event before the next look: no later than the probe budget
    allows and the next due round needs."""
    deadline = last_look + PROBE_S if due_at is None else min(last_look + PROBE_S, due_at)
    return max(deadline - now, 0.0)
