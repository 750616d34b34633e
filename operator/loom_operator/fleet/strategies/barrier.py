"""The Barrier weight sync: freeze every worker, load them all, resume them together.

Owns which workers a Barrier takes out (every healthy pending one at once); never changes a
record or emits an action (`sync.py` holds loaded workers until the release).
"""

from __future__ import annotations

from dataclasses import dataclass

from loom_operator.fleet.desired import SyncPolicy
from loom_operator.fleet.strategies.contract import SyncChoice, SyncRound


@dataclass(frozen=True)
class Barrier:
    """No stale policy after the barrier (what RL training wants); nothing serves meanwhile."""

    name: str = "Barrier"
    mixes_versions: bool = False
    keeps_running: bool = False

    def choose(self, now: SyncRound) -> SyncChoice:
        """Every healthy pending worker, at once."""
        return SyncChoice(tuple(w.name for w in now.pending if w.healthy), "barrier")

    def summary(self, policy: SyncPolicy) -> str:
        return self.name
