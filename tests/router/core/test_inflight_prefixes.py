"""Prefixes on their way into a cache count for routing until their TTL, bounded in size."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from loom_router.core.inflight_prefixes import InFlightPrefixes, WithInFlight


class Held:
    """A precise index that holds `depth` blocks on each endpoint."""

    def __init__(self, depth: dict[str, int]) -> None:
        self.depth = depth

    def match(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        return {e: min(self.depth.get(e, 0), len(keys)) for e in endpoint_ids}


def test_sent_prefixes_match_until_they_expire() -> None:
    pending = InFlightPrefixes(ttl_s=5.0)
    pending.record("a", [1, 2, 3], now=0.0)
    assert pending.match(["a", "b"], [1, 2, 9], now=1.0) == {"a": 2, "b": 0}
    assert pending.match(["a"], [1, 2, 3], now=5.0) == {"a": 0}
    assert len(pending) == 0


def test_the_record_is_bounded_and_forgets_endpoints() -> None:
    pending = InFlightPrefixes(ttl_s=60.0, max_entries=4)
    pending.record("a", [1, 2, 3], now=0.0)
    pending.record("b", [1, 2], now=1.0)
    assert len(pending) == 4 and pending.match(["a"], [1], now=2.0) == {"a": 0}  # oldest went
    assert pending.evictions == 1  # counted (expiry is not eviction)
    pending.forget("b")
    assert pending.match(["b"], [1, 2], now=2.0) == {"b": 0}


def test_the_lookup_takes_the_longer_of_cached_and_coming() -> None:
    pending = InFlightPrefixes()
    pending.record("b", [1, 2, 3, 4], now=0.0)
    lookup = WithInFlight(Held({"a": 3, "b": 1}), pending, now=1.0)
    assert lookup.match(["a", "b", "c"], [1, 2, 3, 4]) == {"a": 3, "b": 4, "c": 0}
