"""PCP's DualChunkSwap split of a prompt: 2N chunks, rank r takes chunks r and 2N−1−r, so every
rank gets the same mix of cheap (early) and expensive (late) causal rows; and the inverse
permutation that restores token order after the ranks' rows are gathered.

Pure arithmetic over token indices; never touches torch or a process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


def chunk_bounds(length: int, world: int) -> tuple[tuple[int, int], ...]:
    """The 2·world chunks [start, end) of `length` tokens, as even as can be: the first
    `length mod 2·world` chunks hold one token more."""
    if length < 0 or world < 1:
        raise ValueError(f"length {length} and world {world}: need length >= 0 and world >= 1")
    parts = 2 * world
    base, extra = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return tuple(bounds)


def rank_tokens(length: int, world: int, rank: int) -> tuple[int, ...]:
    """Token indices rank `rank` computes, in order: chunk r, then chunk 2·world−1−r."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a PCP group of {world}")
    bounds = chunk_bounds(length, world)
    first, second = bounds[rank], bounds[2 * world - 1 - rank]
    return tuple(range(*first)) + tuple(range(*second))


@dataclass(frozen=True)
class DualChunkPlan:
    """One prompt's split over a PCP group: what each rank holds, and how to undo the split.

    Gathering every rank's rows in rank order gives `gathered` (token indices); row i of
    the restored sequence is gathered row `restore[i]`.
    """

    length: int
    world: int
    shares: tuple[tuple[int, ...], ...]  # per rank, its token indices

    @classmethod
    def of(cls, length: int, world: int) -> DualChunkPlan:
        shares = tuple(rank_tokens(length, world, r) for r in range(world))
        return cls(length=length, world=world, shares=shares)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(len(s) for s in self.shares)

    @cached_property
    def gathered(self) -> tuple[int, ...]:
        return tuple(t for share in self.shares for t in share)

    @cached_property
    def restore(self) -> tuple[int, ...]:
        where = [0] * self.length
        for row, token in enumerate(self.gathered):
            where[token] = row
        return tuple(where)
