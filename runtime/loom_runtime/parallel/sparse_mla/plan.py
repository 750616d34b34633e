"""RankPlan: what one rank of a sparse-mla worker is, for its forwards: its layout coordinates,
its PCP, DCP and EP groups (joined once), and how DCP merges partial attention.

Owns joining the groups a layout implies; never runs a forward or moves rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist

from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.parallel.collectives import Comm
from loom_runtime.parallel.layout import LayoutError, ParallelLayout, RankCoords

DcpBackend = Literal["ag_rs", "a2a"]  # vLLM's --dcp-comm-backend
KINDS = ("pcp", "dcp", "ep")


@dataclass(frozen=True)
class RankPlan:
    layout: ParallelLayout
    coords: RankCoords
    pcp: Comm
    dcp: Comm
    ep: Comm
    device: torch.device
    dcp_backend: DcpBackend = "ag_rs"

    @classmethod
    def single(cls, device: torch.device | str = "cpu") -> RankPlan:
        """One rank, no groups: the parallel code path with every collective the identity."""
        layout = ParallelLayout()
        one = Comm.single()
        return cls(layout, layout.coords(0), one, one, one, torch.device(device))

    def check(self, config: SparseMlaConfig) -> None:
        """The model must split the way the layout asks; LayoutError says how it does not."""
        problems = []
        if self.layout.tp > 1:
            problems.append("tp > 1 is not implemented for sparse-mla (use pcp, dcp and ep)")
        heads = config.num_attention_heads
        if heads % self.dcp.size:
            problems.append(f"dcp ({self.dcp.size}) must divide num_attention_heads ({heads})")
        experts = config.n_routed_experts
        if experts % self.ep.size:
            problems.append(f"ep ({self.ep.size}) must divide n_routed_experts ({experts})")
        if problems:
            raise LayoutError(f"sparse-mla on {self.layout.describe()}: " + "; ".join(problems))


def join_groups(
    layout: ParallelLayout,
    rank: int,
    device: torch.device,
    timeout_s: float,
    dcp_backend: DcpBackend = "ag_rs",
) -> RankPlan:
    """Create every PCP, DCP and EP group of the layout (every rank creates all of them, in
    the same order, as torch.distributed requires) and keep this rank's."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world != layout.world:
        raise LayoutError(f"layout {layout.describe()} needs {layout.world} ranks, not {world}")
    groups = layout.groups()
    mine: dict[str, Comm] = {}
    for kind in KINDS:
        for ranks in getattr(groups, kind):
            group = None
            if len(ranks) > 1:
                group = dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))
            if rank in ranks:
                mine[kind] = Comm(ranks=ranks, index=ranks.index(rank), group=group)
    return RankPlan(
        layout=layout,
        coords=layout.coords(rank),
        pcp=mine["pcp"],
        dcp=mine["dcp"],
        ep=mine["ep"],
        device=device,
        dcp_backend=dcp_backend,
    )
