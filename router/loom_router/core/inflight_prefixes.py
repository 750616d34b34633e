"""Prefixes on their way into an engine's cache: block keys the router just sent somewhere, for the
seconds before that engine's KV events say it stored them.

Owns a bounded, expiring record and a PrefixLookup that adds it to the precise index; never
outlives its TTL (the KV events are the truth) and never grows past `max_entries`. Without it a
burst of requests sharing a new prompt would each find no cached prefix and be spread over the
fleet, every worker prefilling the same prompt. Off unless router.inFlightPrefixSeconds > 0:
the record is this replica's alone, so two replicas may decide differently while it counts.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loom_router.core.pipeline import PrefixLookup
from loom_router.errors import ConfigError


class InFlightPrefixes:
    """(endpoint, block key) → expiry, oldest first; thread-safe (one lock)."""

    def __init__(self, ttl_s: float = 10.0, max_entries: int = 200_000) -> None:
        if ttl_s <= 0 or max_entries <= 0:
            raise ConfigError("ttl_s and max_entries must be positive")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._evictions = 0

    def record(self, endpoint_id: str, keys: Sequence[int], now: float) -> None:
        """The router sent a prompt with these block keys to the endpoint at `now`."""
        expiry = now + self.ttl_s
        with self._lock:
            for key in keys:
                entry = (endpoint_id, key)
                self._entries.pop(entry, None)
                self._entries[entry] = expiry
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self._evictions += 1

    def match(self, endpoint_ids: Iterable[str], keys: Sequence[int], now: float) -> dict[str, int]:
        """Consecutive keys from the first that each endpoint was sent within the TTL."""
        with self._lock:
            self._expire(now)
            out: dict[str, int] = {}
            for endpoint_id in endpoint_ids:
                depth = 0
                for key in keys:
                    if (endpoint_id, key) not in self._entries:
                        break
                    depth += 1
                out[endpoint_id] = depth
            return out

    def forget(self, endpoint_id: str) -> None:
        with self._lock:
            for entry in [e for e in self._entries if e[0] == endpoint_id]:
                del self._entries[entry]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def evictions(self) -> int:
        """Entries dropped before their expiry because the record was full."""
        with self._lock:
            return self._evictions

    def _expire(self, now: float) -> None:
        while self._entries:
            entry, expiry = next(iter(self._entries.items()))
            if expiry > now:
                return
            del self._entries[entry]


@dataclass(frozen=True)
class WithInFlight:
    """A PrefixLookup: per endpoint, the longer of what its cache holds and what is on its way."""

    cached: PrefixLookup
    in_flight: InFlightPrefixes
    now: float

    def match(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        ids = list(endpoint_ids)
        held = self.cached.match(ids, keys)
        coming = self.in_flight.match(ids, keys, self.now)
        return {e: max(held.get(e, 0), coming.get(e, 0)) for e in ids}

    def host_blocks(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        """The cached index's host blocks, except where a prompt on its way covers the match
        (its run reloads them onto the device)."""
        ids = list(endpoint_ids)
        held = self.cached.match(ids, keys)
        host = self.cached.host_blocks(ids, keys)
        coming = self.in_flight.match(ids, keys, self.now)
        return {e: 0 if coming.get(e, 0) >= held.get(e, 0) else host.get(e, 0) for e in ids}
