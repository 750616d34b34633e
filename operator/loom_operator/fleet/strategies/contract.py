"""What the weight sync asks a strategy (`SyncStrategy`), and what it hands it (`SyncRound`).

Owns the contract between the sync state machine and a strategy; never decides anything itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from loom_operator.fleet.desired import DesiredFleet, SyncPolicy
from loom_operator.fleet.observed import WorkerState
from loom_operator.fleet.record import Taken, WorkerProgress


@dataclass(frozen=True)
class SyncChoice:
    """The workers to freeze now (or, keeps_running, to load at once), why they may go, and
    (when none may) why not."""

    chosen: tuple[str, ...] = ()
    taken: Taken = ""
    blocked: str = ""
    """A WeightSyncing reason when the sync cannot go on (Rolling: NoSafePair)."""
    message: str = ""


@dataclass(frozen=True)
class SyncRound:
    """What a strategy sees when it picks the next workers, after this round's steps."""

    desired: DesiredFleet
    members: Mapping[str, WorkerState]
    """Desired workers the substrate knows, by name, in slot order."""
    progress: Mapping[str, WorkerProgress]
    """Each member's step after this round."""
    failed: frozenset[str]
    """Members failover counts as failed now."""
    frozen_now: frozenset[str]
    """Members this round sends Freeze (they stop serving once it is carried out)."""

    @property
    def target(self) -> str:
        return self.desired.weights_version

    @property
    def pending(self) -> tuple[WorkerState, ...]:
        """Members not yet started in this sync and not failed, in slot order."""
        return tuple(
            w
            for n, w in self.members.items()
            if self.progress[n].step == "pending" and n not in self.failed
        )


class SyncStrategy(Protocol):
    """One weight-sync strategy: which workers go next, and whether versions may mix."""

    @property
    def name(self) -> str:
        """The card's `weightSync.strategy` value; also the WeightSyncing reason while it runs."""
        ...

    @property
    def mixes_versions(self) -> bool:
        """True when workers on the target serve beside workers on the old version (Rolling).

        False (Barrier): the sync holds every worker, pending ones too, until all healthy ones
        are loaded, then resumes them together; meanwhile nothing serves, by design.
        """
        ...

    @property
    def keeps_running(self) -> bool:
        """True (Keep): a chosen worker is not frozen or drained; LoadWeights swaps the pushed
        weights in under its running requests, with the push's kv policy (`SyncPolicy.kv`)."""
        ...

    def choose(self, now: SyncRound) -> SyncChoice:
        """The pending workers to freeze now (none, with a reason, when none may go)."""
        ...

    def summary(self, policy: SyncPolicy) -> str:
        """Name and limits for the WeightSyncing message: `Rolling, maxUnavailable 1`."""
        ...
