"""EP's expert placement and dispatch order: rank r of an EP group of W owns the contiguous
block of E/W routed experts [r·E/W, (r+1)·E/W); a token's (token, slot) pairs are sent to the
owners of their experts, grouped by owner.

Pure arithmetic over expert ids and routing tensors; never communicates or runs an expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loom_runtime.parallel.layout import LayoutError


@dataclass(frozen=True)
class ExpertPlacement:
    """Which rank of an EP group owns each routed expert."""

    n_experts: int
    world: int

    def __post_init__(self) -> None:
        if self.world < 1 or self.n_experts < 1 or self.n_experts % self.world:
            raise LayoutError(
                f"ep ({self.world}) must divide the model's n_routed_experts ({self.n_experts})"
            )

    @property
    def per_rank(self) -> int:
        return self.n_experts // self.world

    def owner(self, expert: int) -> int:
        return expert // self.per_rank

    def local(self, rank: int) -> range:
        """The experts `rank` owns."""
        return range(rank * self.per_rank, (rank + 1) * self.per_rank)


@dataclass(frozen=True)
class Dispatch:
    """The send order of one forward's (token, slot) pairs, flattened row-major from [T, k]:
    `order` lists pair indices grouped by owner rank (rank 0's first, each group in pair
    order) and `counts[r]` is how many go to rank r."""

    order: torch.Tensor  # [T·k] int64
    counts: tuple[int, ...]


def plan_dispatch(experts: torch.Tensor, placement: ExpertPlacement) -> Dispatch:
    """The dispatch of routed experts ([T, k] int64) over the placement's ranks."""
    owners = experts.reshape(-1) // placement.per_rank
    order = torch.sort(owners, stable=True).indices
    counts = torch.bincount(owners, minlength=placement.world)
    return Dispatch(order=order, counts=tuple(int(c) for c in counts.tolist()))
