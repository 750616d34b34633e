"""The precise index's storage: which endpoint holds which block key, under one LRU cap.

Owns the bounded map and its layout; never parses events or checks sequence numbers (the
PrefixIndex does) and holds no lock of its own (the PrefixIndex serialises calls).

Layout, chosen so a million entries cost the cyclic garbage collector nothing: every endpoint
gets a small slot number; a block's holders are one int bitmask of slots; an entry is the int
`key << SLOT_BITS | slot` in a plain dict kept in LRU order (insertion order, refreshed by
re-inserting) whose value is its tier bitmask; an endpoint's keys are a dict used as a set.
Dicts holding only ints are untracked by the GC, so a full collection does not walk them
(an OrderedDict or sets would cost ~50 ms per million entries at every full collection).
When full, the oldest `max_entries // 64` entries (at least one) are evicted at once, which
keeps eviction O(1) amortised over a plain dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice

from loom_router.errors import ConfigError

SLOT_BITS = 16
MAX_SLOTS = 1 << SLOT_BITS
_SLOT_MASK = MAX_SLOTS - 1


class BlockMap:
    """(endpoint, block key) entries with per-entry tier bits; at most `max_entries` of them."""

    def __init__(self, max_entries: int) -> None:
        if max_entries <= 0:
            raise ConfigError(f"max_entries must be positive, got {max_entries}")
        self.max_entries = max_entries
        self.evictions = 0
        self._evict_batch = max(1, max_entries // 64)
        self._entries: dict[int, int] = {}  # key << SLOT_BITS | slot -> tiers, oldest first
        self._holders: dict[int, int] = {}  # key -> bitmask of slots
        self._by_slot: dict[int, dict[int, None]] = {}  # slot -> its keys
        self._slots: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def endpoints(self) -> int:
        """Endpoints holding at least one block."""
        return len(self._by_slot)

    def count(self, endpoint_id: str) -> int:
        slot = self._slots.get(endpoint_id)
        return 0 if slot is None else len(self._by_slot.get(slot, ()))

    def store(self, endpoint_id: str, key: int, tier: int) -> None:
        """The endpoint holds the block in `tier`; refreshes the entry's LRU position."""
        slot = self._slot(endpoint_id)
        entry = key << SLOT_BITS | slot
        tiers = self._entries.get(entry)
        if tiers is not None:
            del self._entries[entry]  # re-inserted below: now the newest
            self._entries[entry] = tiers | tier
            return
        self._entries[entry] = tier
        self._holders[key] = self._holders.get(key, 0) | 1 << slot
        self._by_slot.setdefault(slot, {})[key] = None
        if len(self._entries) > self.max_entries:
            self._evict(len(self._entries) - self.max_entries + self._evict_batch - 1)

    def unstore(self, endpoint_id: str, key: int, tier: int) -> bool:
        """The endpoint no longer holds the block in `tier`; True if an entry changed."""
        slot = self._slots.get(endpoint_id)
        if slot is None:
            return False
        entry = key << SLOT_BITS | slot
        tiers = self._entries.get(entry)
        if tiers is None:
            return False
        if tiers & ~tier:
            self._entries[entry] = tiers & ~tier
        else:
            del self._entries[entry]
            self._forget(slot, key)
        return True

    def drop(self, endpoint_id: str) -> None:
        """Every block of the endpoint goes; it keeps its slot."""
        slot = self._slots.get(endpoint_id)
        if slot is None:
            return
        bit = 1 << slot
        for key in self._by_slot.pop(slot, {}):
            del self._entries[key << SLOT_BITS | slot]
            held = self._holders[key] & ~bit
            if held:
                self._holders[key] = held
            else:
                del self._holders[key]

    def release(self, endpoint_id: str) -> None:
        """The endpoint left: its blocks go and its slot is reused."""
        self.drop(endpoint_id)
        slot = self._slots.pop(endpoint_id, None)
        if slot is not None:
            del self._names[slot]
            self._free.append(slot)

    def tiers(self, endpoint_id: str, key: int) -> int:
        """The tier bits the endpoint holds the block in (0: it does not hold it)."""
        slot = self._slots.get(endpoint_id)
        return 0 if slot is None else self._entries.get(key << SLOT_BITS | slot, 0)

    def match(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        """Consecutive blocks from the first key that each endpoint holds (0 when none)."""
        counts = dict.fromkeys(endpoint_ids, 0)
        active = 0
        for endpoint_id in counts:
            slot = self._slots.get(endpoint_id)
            if slot is not None and slot in self._by_slot:
                active |= 1 << slot
        held_by = self._holders.get
        depth = 0
        for key in keys:
            if not active:
                break
            still = held_by(key, 0) & active
            if still != active:
                self._record(counts, active ^ still, depth)
                active = still
            depth += 1
        self._record(counts, active, depth)
        return counts

    def _record(self, counts: dict[str, int], slots: int, depth: int) -> None:
        while slots:
            low = slots & -slots
            counts[self._names[low.bit_length() - 1]] = depth
            slots ^= low

    def _slot(self, endpoint_id: str) -> int:
        slot = self._slots.get(endpoint_id)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
        elif len(self._slots) < MAX_SLOTS:
            slot = len(self._slots)
        else:
            raise ConfigError(f"more than {MAX_SLOTS} endpoints in the prefix index")
        self._slots[endpoint_id] = slot
        self._names[slot] = endpoint_id
        return slot

    def _evict(self, count: int) -> None:
        """Drop the `count` oldest entries."""
        for entry in list(islice(self._entries, min(count, len(self._entries)))):
            del self._entries[entry]
            self._forget(entry & _SLOT_MASK, entry >> SLOT_BITS)
        self.evictions += count

    def _forget(self, slot: int, key: int) -> None:
        held = self._holders.get(key, 0) & ~(1 << slot)
        if held:
            self._holders[key] = held
        else:
            self._holders.pop(key, None)
        keys = self._by_slot.get(slot)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._by_slot[slot]
