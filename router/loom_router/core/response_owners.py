"""Which worker holds each stored response (/v1/responses): a later request that continues one
(`previous_response_id`) must go where it is stored. Learned from the answers the router relays.

Owns the bound (the oldest forgotten first, as a worker forgets its oldest); never picks.
"""

from __future__ import annotations

from collections import OrderedDict

CAPACITY = 65_536
"""Responses remembered: far more than one worker keeps (its store holds 1,024)."""


class ResponseOwners:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[str, str] = OrderedDict()

    def learn(self, response_id: str, endpoint_id: str) -> None:
        self._owner[response_id] = endpoint_id
        self._owner.move_to_end(response_id)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def owner(self, response_id: str) -> str | None:
        return self._owner.get(response_id)
