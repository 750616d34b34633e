"""DCP's token ownership: token t lives on rank (t // I) mod W, in local slot
(t // (W·I))·I + t mod I; the local length of an L-token sequence on rank r is
(L // (W·I))·I + clamp(L mod (W·I) − r·I, 0, I) (REFERENCE.md §A, the planner's formula).

Pure arithmetic over positions; never touches torch or a process group.
"""

from __future__ import annotations

from dataclasses import dataclass


def owner(position: int, world: int, interleave: int) -> int:
    """The DCP rank that stores token `position`."""
    return (position // interleave) % world


def local_slot(position: int, world: int, interleave: int) -> int:
    """Where token `position` sits among its owner's tokens (0 = its first)."""
    return (position // (world * interleave)) * interleave + position % interleave


def global_position(slot: int, world: int, interleave: int, rank: int) -> int:
    """The token in local slot `slot` of `rank` (the inverse of local_slot)."""
    return (slot // interleave) * world * interleave + rank * interleave + slot % interleave


def local_length(length: int, world: int, interleave: int, rank: int) -> int:
    """Tokens of a `length`-token sequence stored on DCP `rank`."""
    stride = world * interleave
    tail = min(max(length % stride - rank * interleave, 0), interleave)
    return (length // stride) * interleave + tail


@dataclass(frozen=True)
class ShardMap:
    """One rank's view of a DCP group: which positions are its own."""

    world: int
    interleave: int
    rank: int

    def __post_init__(self) -> None:
        if self.world < 1 or self.interleave < 1 or not 0 <= self.rank < self.world:
            raise ValueError(
                f"DCP shard rank {self.rank} of world {self.world}, interleave "
                f"{self.interleave}: need world, interleave >= 1 and 0 <= rank < world"
            )

    def owns(self, position: int) -> bool:
        return owner(position, self.world, self.interleave) == self.rank

    def local_length(self, length: int) -> int:
        return local_length(length, self.world, self.interleave, self.rank)

    def owned(self, start: int, end: int) -> tuple[int, ...]:
        """Positions in [start, end) this rank stores, in order."""
        return tuple(p for p in range(start, end) if self.owns(p))

    def positions(self, local: int) -> tuple[int, ...]:
        """Global positions of this rank's first `local` slots."""
        return tuple(
            global_position(s, self.world, self.interleave, self.rank) for s in range(local)
        )
