"""ParallelLayout: one role's parallelism (dp, tp, pcp, dcp, ep, interleave) and the process
groups it implies: which global ranks form each TP, PCP, DCP and EP group.

Pure arithmetic over rank numbers, the same rules as the DeploymentCard and the capacity
planner (ranks = dp × tp × pcp; DCP and EP are carved out of them); never touches torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom_runtime.errors import LoomError


class LayoutError(LoomError):
    """A parallelism that the ranks of one worker cannot be split into."""


@dataclass(frozen=True)
class RankCoords:
    """Where one global rank sits: its index inside each of its groups."""

    rank: int
    dp: int
    pcp: int
    tp: int
    dcp: int  # index inside its DCP group (the KV shard it owns)
    ep: int  # index inside its EP group (the block of experts it owns)


@dataclass(frozen=True)
class ProcessGroups:
    """Every group of each kind, as tuples of global ranks (each rank is in one of each kind)."""

    tp: tuple[tuple[int, ...], ...]
    pcp: tuple[tuple[int, ...], ...]
    dcp: tuple[tuple[int, ...], ...]
    ep: tuple[tuple[int, ...], ...]

    def of(self, kind: str, rank: int) -> tuple[int, ...]:
        """The group of `kind` ("tp", "pcp", "dcp", "ep") that holds `rank`."""
        groups: tuple[tuple[int, ...], ...] = getattr(self, kind)
        return next(g for g in groups if rank in g)


@dataclass(frozen=True)
class ParallelLayout:
    """Rank r = (d · pcp + p) · tp + t: TP innermost (vLLM's order). DCP groups are runs of
    `dcp` consecutive ranks inside one replica's tp × pcp ranks; EP groups are runs of `ep`
    consecutive ranks over the whole world."""

    dp: int = 1
    tp: int = 1
    pcp: int = 1
    dcp: int = 1
    ep: int = 1
    interleave: int = 1  # DCP: consecutive tokens on one rank before the next (cpKvInterleave)

    def __post_init__(self) -> None:
        problems = [f"{n} must be >= 1" for n in _FIELDS if getattr(self, n) < 1]
        if not problems:
            problems = self._rule_problems()
        if problems:
            raise LayoutError(f"parallelism {self.describe()}: " + "; ".join(problems))

    def _rule_problems(self) -> list[str]:
        problems = []
        if self.pcp > 1 and self.dp > 1:
            problems.append("pcp > 1 cannot be combined with dp > 1")
        if (self.tp * self.pcp) % self.dcp:
            problems.append(f"dcp ({self.dcp}) must divide tp × pcp ({self.tp * self.pcp})")
        if self.world % self.ep:
            problems.append(f"ep ({self.ep}) must divide dp × tp × pcp ({self.world})")
        if self.interleave > 1 and self.pcp == 1 and self.dcp == 1:
            problems.append("interleave only applies with pcp > 1 or dcp > 1; leave it at 1")
        return problems

    @property
    def world(self) -> int:
        """Ranks (devices) of one worker: dp × tp × pcp."""
        return self.dp * self.tp * self.pcp

    def describe(self) -> str:
        return " ".join(f"{n}{getattr(self, n)}" for n in _FIELDS)

    def coords(self, rank: int) -> RankCoords:
        if not 0 <= rank < self.world:
            raise LayoutError(f"rank {rank} is outside a world of {self.world} ranks")
        t = rank % self.tp
        p = (rank // self.tp) % self.pcp
        d = rank // (self.tp * self.pcp)
        return RankCoords(rank=rank, dp=d, pcp=p, tp=t, dcp=rank % self.dcp, ep=rank % self.ep)

    def groups(self) -> ProcessGroups:
        ranks = range(self.world)
        replica = self.tp * self.pcp
        pcp = tuple(
            tuple(base + p * self.tp + t for p in range(self.pcp))
            for base in range(0, self.world, replica)
            for t in range(self.tp)
        )
        return ProcessGroups(
            tp=_runs(ranks, self.tp),
            pcp=pcp,
            dcp=_runs(ranks, self.dcp),
            ep=_runs(ranks, self.ep),
        )


_FIELDS = ("dp", "tp", "pcp", "dcp", "ep", "interleave")


def _runs(ranks: range, size: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive runs of `size` ranks."""
    return tuple(tuple(ranks[i : i + size]) for i in range(0, len(ranks), size))
