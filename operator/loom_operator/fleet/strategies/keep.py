"""The Keep weight sync (a trainer's push in mode keep): every worker swaps the pushed weights in
under its running requests, none frozen or drained.

Owns which workers a Keep takes (every healthy pending one at once); never changes a record or
emits an action (`sync.py` sends each LoadWeights with the push's kv policy).
"""

from __future__ import annotations

from dataclasses import dataclass

from loom_operator.fleet.desired import SyncPolicy
from loom_operator.fleet.strategies.contract import SyncChoice, SyncRound


@dataclass(frozen=True)
class Keep:
    """Requests in flight go on across the swap (each token tagged with its version); a push only
    (a card cannot name it: a checkpoint is loaded into a drained worker)."""

    name: str = "Keep"
    mixes_versions: bool = True
    keeps_running: bool = True

    def choose(self, now: SyncRound) -> SyncChoice:
        """Every healthy pending worker, at once."""
        return SyncChoice(tuple(w.name for w in now.pending if w.healthy), "keep")

    def summary(self, policy: SyncPolicy) -> str:
        return f"{self.name}, kv {policy.kv or 'keep'}"
