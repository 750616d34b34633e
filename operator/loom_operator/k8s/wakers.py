"""One wake-up per DeploymentCard: the watch handlers set it when something the card's fleet
round reads changed, its loop (card_loop.py) waits on it between looks.

Owns the events (one per card whose loop runs, in kopf's memo); never decides whether a change
matters (round_inputs.py does, at the next look).
"""

from __future__ import annotations

import asyncio

Key = tuple[str, str]
"""(namespace, DeploymentCard name)."""


class CardWakers:
    """Events of the running card loops; used from kopf's event loop only."""

    def __init__(self) -> None:
        self._events: dict[Key, asyncio.Event] = {}

    def event(self, key: Key) -> asyncio.Event:
        """The card's event (made when its loop starts)."""
        return self._events.setdefault(key, asyncio.Event())

    def wake(self, key: Key) -> None:
        """Wake the card's loop (a card without one is skipped: its loop's first look comes)."""
        event = self._events.get(key)
        if event is not None:
            event.set()

    def wake_namespace(self, namespace: str) -> None:
        for (ns, _), event in self._events.items():
            if ns == namespace:
                event.set()

    def wake_all(self) -> None:
        """Wake every card's loop (the shards this replica acts on changed)."""
        for event in self._events.values():
            event.set()

    def forget(self, key: Key) -> None:
        self._events.pop(key, None)

    def pending(self) -> int:
        """Cards woken whose loop has not looked yet: the operator's queue depth."""
        return sum(1 for e in self._events.values() if e.is_set())
