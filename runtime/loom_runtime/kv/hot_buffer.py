"""HotBuffer: one request's (one layer's) map from token positions to a bounded set of device
slots, least recently used out first: the slot bookkeeping of Hybrid HiSparse decode.

Owns the position -> slot map and its LRU order only; never holds or copies rows (the caller
moves the bytes of the misses it is told about).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Resolution:
    """Where each of a step's selected positions lives in the buffer after `resolve`.

    `slots[i]` is the slot of the i-th distinct position asked for (in the order asked);
    `misses` are the (position, slot) pairs whose rows the caller must copy in from the host
    before reading them; every other position was already there (a hit)."""

    positions: tuple[int, ...]
    slots: tuple[int, ...]
    misses: tuple[tuple[int, int], ...]

    @property
    def hits(self) -> int:
        return len(self.positions) - len(self.misses)


class HotBuffer:
    """`capacity` slots (0..capacity-1). A step's selection must fit at once: the positions of
    one `resolve` never evict each other, so at most `capacity` distinct ones per call."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"HotBuffer capacity must be >= 1 slot, got {capacity}")
        self.capacity = capacity
        self._slots: OrderedDict[int, int] = OrderedDict()  # position -> slot, LRU first
        self._free = list(range(capacity - 1, -1, -1))  # pop() hands out slot 0 first

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, position: object) -> bool:
        return position in self._slots

    def positions(self) -> tuple[int, ...]:
        """The positions held, least recently used first."""
        return tuple(self._slots)

    def slot_of(self, position: int) -> int | None:
        """The slot holding `position`, or None; does not touch the LRU order."""
        return self._slots.get(position)

    def resolve(self, positions: Iterable[int]) -> Resolution:
        """Make every position resident: hits are touched (most recently used), misses get a
        free slot or the least recently used one not asked for in this call. Duplicates count
        once. ValueError (and nothing changed) if more distinct positions than slots."""
        wanted = tuple(dict.fromkeys(int(p) for p in positions))
        if len(wanted) > self.capacity:
            raise ValueError(
                f"a step selected {len(wanted)} positions but the hot buffer holds "
                f"{self.capacity} slots: size it to at least the indexer's top-k"
            )
        for p in wanted:  # hits first, so the LRU end holds only positions not asked for
            if p in self._slots:
                self._slots.move_to_end(p)
        misses: list[tuple[int, int]] = []
        for p in wanted:
            if p not in self._slots:
                slot = self._take_slot()
                self._slots[p] = slot
                misses.append((p, slot))
        return Resolution(
            positions=wanted,
            slots=tuple(self._slots[p] for p in wanted),
            misses=tuple(misses),
        )

    def place(self, position: int) -> int:
        """Give `position` a slot as the most recently used one (a row produced on the device,
        so nothing to copy); its slot, evicting the least recently used if full."""
        if position in self._slots:
            self._slots.move_to_end(position)
            return self._slots[position]
        slot = self._take_slot()
        self._slots[position] = slot
        return slot

    def forget_from(self, position: int) -> None:
        """Forget every position from `position` on (their rows were dropped: a rejected
        draft's); their slots are free again."""
        for p in [p for p in self._slots if p >= position]:
            self._free.append(self._slots.pop(p))

    def clear(self) -> None:
        """Forget every position (the request ended or was preempted)."""
        self._slots.clear()
        self._free = list(range(self.capacity - 1, -1, -1))

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        _, slot = self._slots.popitem(last=False)
        return slot
