"""Rank programs for the tests of loom_runtime.parallel.ranks: a world that sums forever (to be
killed or frozen from outside), and one that fails on purpose.

Owns nothing a production worker runs; never used by the runtime itself.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from loom_runtime.parallel.ranks import RankContext


def sum_forever(ctx: RankContext, ready_dir: str) -> None:
    """All-reduce a counter until stopped; rank{r}.ready appears after the first round."""
    x = torch.ones(1, device=ctx.device)
    dist.all_reduce(x)
    (Path(ready_dir) / f"rank{ctx.rank}.ready").write_text(str(int(x.item())))
    while True:
        dist.all_reduce(x)


def raise_on(ctx: RankContext, rank: int) -> int:
    """Rank `rank` raises before its first collective; the others wait on it in an all-reduce."""
    if ctx.rank == rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    x = torch.ones(1, device=ctx.device)
    dist.all_reduce(x)
    return int(x.item())


def world_sum(ctx: RankContext) -> int:
    """Every rank's rank number, summed over the world."""
    x = torch.tensor([float(ctx.rank)], device=ctx.device)
    dist.all_reduce(x)
    return int(x.item())
