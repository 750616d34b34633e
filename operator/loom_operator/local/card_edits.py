"""The card file `loom up` was given, and the state directory's copy `loom apply` writes,
watched for edits: an edit that parses and names the same deployment is installed and applied,
anything else is refused with the reason while the fleet keeps serving the previous card.

Owns the two watches and the installed copy; never acts on the fleet (the round does, with the
cards this hands back) and never prints (events go to a sink).
"""

from __future__ import annotations

import time
from pathlib import Path

from loom_operator.local.cards import CardWatcher, FleetCards, LocalCardError, parse_fleet_cards
from loom_operator.local.events import EventSink, FleetEvent
from loom_operator.local.state import Applied, StatePaths, load_applied, save_applied


class CardEdits:
    """Watches both card files of one fleet."""

    def __init__(
        self, paths: StatePaths, cards: FleetCards, origin: Path, events: EventSink
    ) -> None:
        self._paths = paths
        self._origin = origin.resolve()
        self._events = events
        self._origin_watch = CardWatcher(self._origin, cards.sha256)
        self._state_watch = CardWatcher(paths.card, cards.sha256)

    def install(self, cards: FleetCards, origin: Path | None = None) -> None:
        """Write `cards` as the state directory's copy (what a restarted controller reads)."""
        applied = Applied(str(origin or self._origin), cards.sha256, time.time())
        save_applied(self._paths, cards.text, applied)
        self._state_watch.seen(cards.sha256)

    def check(self, current: FleetCards) -> FleetCards | None:
        """The edited cards to apply now, or None (no edit, or an edit that was refused)."""
        if self._origin_watch.changed():
            return self._reload(current, self._origin, self._origin, install=True)
        if self._state_watch.changed():
            applied = load_applied(self._paths)
            origin = Path(applied.origin) if applied is not None else self._paths.card
            return self._reload(current, self._paths.card, origin, install=False)
        return None

    def _reload(
        self, current: FleetCards, path: Path, origin: Path, install: bool
    ) -> FleetCards | None:
        try:
            cards = parse_fleet_cards(path, origin=origin)
        except (LocalCardError, OSError) as exc:
            msg = f"{path}: not applied, still serving the previous card:\n{exc}"
            self._events(FleetEvent("card", msg, level="error"))
            return None
        if cards.name != current.name:
            msg = (
                f"{path}: DeploymentCard {cards.name} is not {current.name}: a state directory "
                "runs one deployment (use another --state-dir)"
            )
            self._events(FleetEvent("card", msg, level="error"))
            return None
        if install:
            self.install(cards, origin)
        before, after = current.desired, cards.desired
        what = [f"{t.role} ×{t.replicas}" for t in after.roles]
        msg = f"card applied: {', '.join(what)} on {after.weights_version}"
        if after.weights_version != before.weights_version:
            msg += f" (weight sync {before.weights_version} → {after.weights_version}, "
            msg += f"{after.sync.strategy})"
        self._events(FleetEvent("card", msg))
        return cards
