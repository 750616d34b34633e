"""The Rolling weight sync: which workers it takes out next, and why it may take none.

Owns the safety rule of Rolling (at most maxUnavailable out, a routable same-version pair kept, or
the fallback and capacity gap said out loud); never changes a record or emits an action.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loom_operator.fleet.desired import DesiredFleet, SyncPolicy
from loom_operator.fleet.observed import Coverage, WorkerState, coverage
from loom_operator.fleet.record import FAILED_LOAD_TIMEOUT, HELD_STEPS
from loom_operator.fleet.strategies.contract import SyncChoice, SyncRound

NO_SAFE_PAIR = "NoSafePair"


def _greedy(
    desired: DesiredFleet,
    serving: Sequence[WorkerState],
    candidates: Sequence[WorkerState],
    free: int,
    need: Coverage,
) -> tuple[str, ...]:
    """Candidates, in order, whose removal keeps what still serves at `need` or better."""
    chosen: list[str] = []
    remaining = list(serving)
    for c in candidates:
        if len(chosen) >= free:
            break
        rest = [w for w in remaining if w.name != c.name]
        if coverage(rest, desired.disaggregated) >= need:
            chosen.append(c.name)
            remaining = rest
    return tuple(chosen)


def choose_rolling(
    desired: DesiredFleet,
    serving: Sequence[WorkerState],
    candidates: Sequence[WorkerState],
    unavailable: Sequence[str],
    held: int,
) -> SyncChoice:
    """The next workers a Rolling sync freezes.

    `serving`: desired workers routable after this round's other actions. `candidates`: routable
    workers still to sync, in the order to try. `unavailable`: desired workers not serving
    (missing, failed, starting or held). `held`: workers the sync holds out now.

    In order of preference: (1) workers whose removal keeps a routable same-version prefill +
    decode pair (or any worker, when not disaggregated), up to maxUnavailable; only when nothing
    is out and nothing else can move: (2) with one worker per role, all of them at once (a
    capacity gap); (3) workers whose removal leaves decode workers only (aggregated fallback);
    (4) the only worker of a role (a capacity gap no order avoids); else NoSafePair.
    """
    if not candidates:
        return SyncChoice()
    mu = desired.sync.max_unavailable
    free = mu - len(unavailable)
    chosen = _greedy(desired, serving, candidates, free, Coverage.PAIRED)
    if chosen:
        return SyncChoice(chosen, "safe")
    if held:
        return SyncChoice()
    names = ", ".join(c.name for c in candidates)
    out = ", ".join(unavailable)
    if free <= 0:
        return SyncChoice(
            message=f"waiting: {out} unavailable and maxUnavailable is {mu}",
        )
    if all(t.replicas == 1 for t in desired.roles if t.replicas > 0) and not unavailable:
        return SyncChoice(
            tuple(c.name for c in candidates),
            "gap",
            message="one worker per role: they sync together and nothing serves meanwhile",
        )
    chosen = _greedy(desired, serving, candidates, free, Coverage.FALLBACK)
    if chosen:
        return SyncChoice(
            chosen,
            "fallback",
            message="decode workers prefill prompts themselves until a prefill worker of "
            "their version is back",
        )
    singles = tuple(c.name for c in candidates if desired.replicas(c.role) == 1)
    if singles and not unavailable:
        return SyncChoice(
            singles,
            "gap",
            message=f"{', '.join(singles)}: the only worker of its role, so nothing serves "
            "while it syncs",
        )
    why = f"waiting for {out} to serve again" if out else "add a replica or use Barrier"
    return SyncChoice(
        blocked=NO_SAFE_PAIR,
        message=f"taking any of {names} out would leave no routable same-version prefill + "
        f"decode pair; {why}",
    )


@dataclass(frozen=True)
class Rolling:
    """Keeps serving: a few workers at a time, old and new versions side by side."""

    name: str = "Rolling"
    mixes_versions: bool = True
    keeps_running: bool = False

    def choose(self, now: SyncRound) -> SyncChoice:
        """Routable pending workers off the target (`choose_rolling`); none after a LoadTimeout."""
        serving = [
            w
            for n, w in now.members.items()
            if w.routable and n not in now.frozen_now and now.progress[n].step not in HELD_STEPS
        ]
        names = {w.name for w in serving}
        unavailable = tuple(s.name for s in now.desired.slots if s.name not in names)
        candidates = [
            w for w in now.pending if w.routable and w.weights_version not in (None, now.target)
        ]
        if any(p.reason.startswith(FAILED_LOAD_TIMEOUT) for p in now.progress.values()):
            return SyncChoice()
        held = sum(1 for p in now.progress.values() if p.step in HELD_STEPS)
        return choose_rolling(now.desired, serving, candidates, unavailable, held)

    def summary(self, policy: SyncPolicy) -> str:
        return f"{self.name}, maxUnavailable {policy.max_unavailable}"
