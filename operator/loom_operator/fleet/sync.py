"""The weight-sync state machine: freeze → drain → load → resume, per worker, for any strategy.

Owns each worker's step in the persisted `SyncRecord`; never loads a worker that is routed,
admitting or busy, never sends one worker LoadWeights twice for one target, and never touches a
failed worker (failover restarts it on the target version and it re-enters here). Which workers
go next and whether versions may mix are the record's strategy's to say (`strategies/`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from loom_operator.fleet.actions import Freeze, LoadWeights, MigrateRequests, Resume, WorkerAction
from loom_operator.fleet.desired import DesiredFleet
from loom_operator.fleet.failover import worker_failure
from loom_operator.fleet.observed import Coverage, FleetObservation, WorkerState, coverage
from loom_operator.fleet.record import (
    FAILED_DIED,
    FAILED_LOAD_TIMEOUT,
    HELD_STEPS,
    SyncRecord,
    SyncStep,
    Taken,
    WorkerProgress,
)
from loom_operator.fleet.strategies.contract import SyncChoice, SyncRound, SyncStrategy
from loom_operator.fleet.strategies.registry import strategy_named

# WeightSyncing reasons besides the strategy names (docs/fleet.md says what each means).
IN_SYNC = "InSync"
LOAD_TIMEOUT = "LoadTimeout"
CAPACITY_GAP = "CapacityGap"
FALLBACK = "AggregatedFallback"

Step = tuple[WorkerProgress, list[WorkerAction]]


@dataclass(frozen=True)
class SyncPlan:
    """What the sync does this round, its new record, and what WeightSyncing should say."""

    actions: tuple[WorkerAction, ...]
    record: SyncRecord | None
    syncing: bool
    reason: str
    message: str
    wake_at: float | None
    explains_outage: bool = False
    """True when the sync itself is why nothing may serve (a Barrier, a capacity gap)."""


@dataclass(frozen=True)
class SyncContext:
    """What one worker's step depends on besides the worker: the fleet, the sync, the time."""

    desired: DesiredFleet
    record: SyncRecord
    now: float

    @property
    def target(self) -> str:
        return self.desired.weights_version

    @property
    def strategy(self) -> SyncStrategy:
        return strategy_named(self.record.strategy)

    @property
    def resume_closed(self) -> bool:
        """Versions may not mix and not every worker is loaded: nothing held may resume yet."""
        return not self.strategy.mixes_versions and self.record.released_at is None


def holds(record: SyncRecord | None, name: str) -> bool:
    """True when the sync, not the controller's routing rule, decides whether `name` serves."""
    if record is None or not record.active:
        return False
    p = record.get(name)
    if p is None:
        return False
    return p.step in (*HELD_STEPS, "failed") or (
        p.step == "pending" and not strategy_named(record.strategy).mixes_versions
    )


def _to(p: WorkerProgress, step: SyncStep, now: float) -> WorkerProgress:
    return replace(p, step=step, since=now)


def _entry(w: WorkerState, target: str, old: WorkerProgress | None, now: float) -> WorkerProgress:
    """A worker's first progress in a sync (carrying over a drain begun for an older target)."""
    if w.weights_version == target and w.routable:
        return WorkerProgress(w.name, "resumed", since=now)
    if old is not None and old.step in ("frozen", "drained"):
        return WorkerProgress(
            w.name, "frozen", since=now, frozen_at=old.frozen_at or now, taken=old.taken
        )
    return WorkerProgress(w.name, "pending", since=now)


def _members(desired: DesiredFleet, observed: FleetObservation) -> dict[str, WorkerState]:
    """Desired workers the substrate knows, by name, in slot order."""
    out = {}
    for slot in desired.slots:
        w = observed.get(slot.name)
        if w is not None and w.role == slot.role:
            out[slot.name] = w
    return out


def _open(
    desired: DesiredFleet, members: dict[str, WorkerState], record: SyncRecord | None, now: float
) -> SyncRecord | None:
    """The record to work on: a new one when the target changed and a worker is not on it."""
    target = desired.weights_version
    off = [
        w
        for w in members.values()
        if w.healthy and w.weights_version is not None and w.weights_version != target
    ]
    if record is None or record.target_version != target:
        if not off and (record is None or not record.active):
            return record
        entries = tuple(
            _entry(w, target, record.get(n) if record else None, now) for n, w in members.items()
        )
        return SyncRecord(target, desired.source_uri, desired.sync.strategy, now, entries)
    known = {p.name: p for p in record.workers if p.name in members}
    for name, w in members.items():
        known.setdefault(name, _entry(w, target, None, now))
    finished = record.finished_at
    if finished is not None and off:
        finished = None
        for w in off:
            known[w.name] = WorkerProgress(w.name, "pending", since=now)
    return replace(record, workers=tuple(known.values()), finished_at=finished)


def _frozen(p: WorkerProgress, w: WorkerState, ctx: SyncContext) -> Step:
    """Draining: load once nothing is in flight; migrate what is left past the drain timeout."""
    acts: list[WorkerAction] = [Freeze(w.name)] if w.routed or w.admission_open else []
    if w.loading:  # a LoadWeights sent before a controller restart (or for an older target)
        return _to(p, "drained", ctx.now), acts
    if w.frozen and w.busy == 0:
        drained = _to(p, "drained", ctx.now)
        if w.weights_version == ctx.target:
            return _drained(drained, w, ctx, acts)
        load = LoadWeights(w.name, ctx.desired.source_uri, ctx.target)
        return replace(drained, loads=p.loads + 1), [*acts, load]
    drain_s = ctx.desired.sync.drain_timeout_s
    if p.migrated_at is None and p.frozen_at is not None and ctx.now >= p.frozen_at + drain_s:
        why = f"{w.name} still busy {drain_s:g}s after it froze for the sync to {ctx.target}"
        acts.append(MigrateRequests(w.name, abort=True, reason=why))
        return replace(p, migrated_at=ctx.now), acts
    return p, acts


def _drained(p: WorkerProgress, w: WorkerState, ctx: SyncContext, acts: list[WorkerAction]) -> Step:
    """LoadWeights sent: wait for the worker to report the target version."""
    if w.weights_version == ctx.target and not w.loading:
        return _loaded(_to(p, "loaded", ctx.now), w, ctx, acts)
    if not w.loading and p.loads == 0:  # adopted a load of another target: drain, load ours
        return _frozen(replace(_to(p, "frozen", ctx.now), frozen_at=p.frozen_at or ctx.now), w, ctx)
    load_s = ctx.desired.sync.load_timeout_s
    if p.since is not None and ctx.now >= p.since + load_s:
        why = f"{FAILED_LOAD_TIMEOUT}: {w.name} did not report {ctx.target} {load_s:g}s after "
        why += "LoadWeights"
        return replace(_to(p, "failed", ctx.now), reason=why), acts
    return p, acts


def _loaded(p: WorkerProgress, w: WorkerState, ctx: SyncContext, acts: list[WorkerAction]) -> Step:
    """On the target version: resume, unless the resume is closed (a Barrier before its release)."""
    if not ctx.resume_closed:
        return p, [*acts, Resume(w.name)]
    return p, [*acts, Freeze(w.name)] if w.routed or w.admission_open else acts


def advance(
    p: WorkerProgress, w: WorkerState | None, failure: str | None, ctx: SyncContext
) -> Step:
    """One worker's next step from what it reports now, and the actions that step needs."""
    if w is None or failure is not None:
        if p.step not in HELD_STEPS:
            return p, []
        why = f"{FAILED_DIED}: {p.name} {failure or 'disappeared'} while {p.step}"
        return replace(_to(p, "failed", ctx.now), reason=why), []
    if not w.healthy or p.step == "resumed":
        return p, []
    on_target = w.weights_version == ctx.target
    swapped_serving = p.step == "drained" and ctx.strategy.keeps_running  # Resume re-routes it
    if on_target and w.routable and not swapped_serving:
        return _to(p, "resumed", ctx.now), []
    if p.step == "failed":
        if p.reason.startswith(FAILED_LOAD_TIMEOUT) and not on_target:
            return p, []
        p = replace(p, frozen_at=None, migrated_at=None, reason="")
        p = _to(p, "loaded" if on_target else "pending", ctx.now)
    if p.step == "pending":
        if w.loading:  # a LoadWeights sent before a controller restart is still running
            return replace(_to(p, "drained", ctx.now), taken="adopted"), []
        if not on_target or ctx.resume_closed:
            return p, []
        p = _to(p, "loaded", ctx.now)
    if p.step == "frozen":
        return _frozen(p, w, ctx)
    if p.step == "drained":
        return _drained(p, w, ctx, [])
    return _loaded(p, w, ctx, [])


def _choose(
    ctx: SyncContext,
    members: dict[str, WorkerState],
    failed: Mapping[str, str],
    progress: dict[str, WorkerProgress],
    acts: list[WorkerAction],
) -> SyncChoice:
    frozen_now = frozenset(a.worker for a in acts if isinstance(a, Freeze))
    now = SyncRound(ctx.desired, members, progress, frozenset(failed), frozen_now)
    return ctx.strategy.choose(now)


def plan_sync(
    desired: DesiredFleet, observed: FleetObservation, record: SyncRecord | None
) -> SyncPlan:
    """Advance the sync to `desired.weights_version` by one round (a pure function)."""
    now = observed.now
    members = _members(desired, observed)
    record = _open(desired, members, record, now)
    if record is None or not record.active:
        return SyncPlan((), record, False, IN_SYNC, _in_sync(desired), None)
    ctx = SyncContext(desired, record, now)
    failed = {n: f for n, w in members.items() if (f := worker_failure(w, desired.failover, now))}
    progress: dict[str, WorkerProgress] = {}
    acts: list[WorkerAction] = []
    for p in record.workers:
        progress[p.name], more = advance(p, members.get(p.name), failed.get(p.name), ctx)
        acts.extend(more)
    choice = _choose(ctx, members, failed, progress, acts)
    for name in choice.chosen:
        p = progress[name]
        taken: Taken = choice.taken
        if ctx.strategy.keeps_running:  # loaded under its running requests: no freeze, no drain
            progress[name] = replace(_to(p, "drained", now), loads=p.loads + 1, taken=taken)
            acts.append(LoadWeights(name, desired.source_uri, ctx.target, desired.sync.kv))
            continue
        progress[name] = replace(
            _to(p, "frozen", now), frozen_at=now, migrated_at=None, taken=taken
        )
        acts.append(Freeze(name))
    record = replace(record, workers=tuple(progress.values()))
    if all(p.step == "resumed" for p in record.workers):
        record = replace(record, finished_at=now)
    elif _may_release(ctx.strategy, record, members, failed):
        loaded = {p.name for p in record.workers if p.step == "loaded"}
        held_back = [a for a in acts if isinstance(a, Freeze) and a.worker in loaded]
        acts = [a for a in acts if a not in held_back] + [Resume(n) for n in sorted(loaded)]
        record = replace(record, released_at=now)
    return _report(desired, members, record, choice, acts, ctx.strategy)


def _may_release(
    strategy: SyncStrategy,
    record: SyncRecord,
    members: dict[str, WorkerState],
    failed: Mapping[str, str],
) -> bool:
    """Versions may not mix (Barrier) and every healthy worker is loaded (failed ones come back
    on the target anyway)."""
    if strategy.mixes_versions or record.released_at is not None:
        return False
    waiting = [
        p
        for p in record.workers
        if p.step != "loaded"
        and p.step != "resumed"
        and p.name in members
        and p.name not in failed
        and members[p.name].healthy
    ]
    return not waiting and any(p.step == "loaded" for p in record.workers)


def _in_sync(desired: DesiredFleet) -> str:
    return f"every worker serves {desired.component} {desired.weights_version}"


def _projected(
    desired: DesiredFleet, members: dict[str, WorkerState], acts: list[WorkerAction]
) -> Coverage:
    """What the desired workers serve once this round's sync actions are carried out."""
    out = {a.worker for a in acts if isinstance(a, Freeze | MigrateRequests)}
    back = {a.worker for a in acts if isinstance(a, Resume)}
    routable = [
        w for n, w in members.items() if n not in out and (w.routable or (n in back and w.healthy))
    ]
    return coverage(routable, desired.disaggregated)


def _describe(p: WorkerProgress) -> str:
    if p.step == "frozen":
        late = " (the rest migrated after the drain timeout)" if p.migrated_at is not None else ""
        return f"{p.name} draining{late}"
    if p.step == "drained":
        return f"{p.name} loading weights"
    if p.step == "loaded":
        return f"{p.name} loaded, waiting to resume"
    return f"{p.name} failed ({p.reason})"


def _deadline(p: WorkerProgress, desired: DesiredFleet) -> float | None:
    if p.step == "frozen" and p.migrated_at is None and p.frozen_at is not None:
        return p.frozen_at + desired.sync.drain_timeout_s
    if p.step == "drained" and p.since is not None:
        return p.since + desired.sync.load_timeout_s
    return None


def _report(
    desired: DesiredFleet,
    members: dict[str, WorkerState],
    record: SyncRecord,
    choice: SyncChoice,
    acts: list[WorkerAction],
    strategy: SyncStrategy,
) -> SyncPlan:
    if not record.active:
        return SyncPlan(tuple(acts), record, False, IN_SYNC, _in_sync(desired), None)
    done = sum(1 for p in record.workers if p.step == "resumed")
    head = (
        f"{desired.component} → {record.target_version} ({strategy.summary(desired.sync)}): "
        f"{done}/{len(record.workers)} workers done"
    )
    details = [_describe(p) for p in record.workers if p.step not in ("pending", "resumed")]
    message = "; ".join([head, *details, *([choice.message] if choice.message else [])])
    resuming = {a.worker for a in acts if isinstance(a, Resume)}
    held_taken = {p.taken for p in record.held() if p.name not in resuming}
    if any(p.reason.startswith(FAILED_LOAD_TIMEOUT) for p in record.workers):
        reason = LOAD_TIMEOUT
        message += "; no more workers are taken out: check the worker's log and the source uri"
    elif choice.blocked:
        reason = choice.blocked
    elif "gap" in held_taken:
        reason = CAPACITY_GAP
    elif "fallback" in held_taken or _projected(desired, members, acts) == Coverage.FALLBACK:
        reason = FALLBACK
    else:
        reason = strategy.name
    wakes = [d for p in record.workers if (d := _deadline(p, desired)) is not None]
    outage = reason == CAPACITY_GAP or (reason == strategy.name and not strategy.mixes_versions)
    return SyncPlan(tuple(acts), record, True, reason, message, min(wakes, default=None), outage)
