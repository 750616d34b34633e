"""EP MoE: each rank of an EP group keeps only its block of a layer's routed experts; tokens are
routed locally, each (token, slot) pair is sent to its expert's rank and its output sent back
(two all-to-alls each way: rows, expert ids), then combined exactly as one rank combines them.

Owns the local experts' weights and the dispatch/combine; never routes by other rules than
gating.py, and never holds another rank's experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loom_runtime.models.sparse_mla.ffn import MoeFfn
from loom_runtime.models.sparse_mla.gating import route
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM
from loom_runtime.parallel.collectives import Comm, all_to_all_rows, exchange_counts
from loom_runtime.parallel.experts import ExpertPlacement, plan_dispatch


class ExpertParallelMoe:
    """One MoE layer on one EP rank. The router and the shared expert stay replicated."""

    def __init__(self, moe: MoeFfn, comm: Comm) -> None:
        self.config = moe.config
        self.comm = comm
        self.placement = ExpertPlacement(moe.config.n_routed_experts, comm.size)
        self.local = self.placement.local(comm.index)
        self.gate = moe.gate
        self.correction_bias = moe.correction_bias
        self.shared = moe.shared
        self.gate_up = moe.experts_gate_up[self.local.start : self.local.stop].clone()
        self.down = moe.experts_down[self.local.start : self.local.stop].clone()
        # The other ranks' experts are theirs: drop the full stacks this rank loaded.
        moe.experts_gate_up = moe.experts_gate_up.new_empty(0)
        moe.experts_down = moe.experts_down.new_empty(0)

    @property
    def expert_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.gate_up, self.down))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routing = route(x, self.gate, self.correction_bias, self.config)
        k = routing.experts.shape[1]
        dispatch = plan_dispatch(routing.experts, self.placement)
        tokens = dispatch.order // k
        experts = routing.experts.reshape(-1)[dispatch.order]
        recv = exchange_counts(self.comm, dispatch.counts, x.device)
        rows, _ = all_to_all_rows(self.comm, x[tokens], dispatch.counts, recv)
        ids, _ = all_to_all_rows(self.comm, experts, dispatch.counts, recv)
        outputs = self._run_local(rows, ids)
        back, _ = all_to_all_rows(self.comm, outputs, recv, dispatch.counts)
        per_pair = torch.empty_like(back)
        per_pair[dispatch.order] = back  # row i = pair i of the flattened [T, k] routing
        out = torch.zeros_like(x)
        for expert in torch.unique(routing.experts).tolist():
            token, slot = torch.where(routing.experts == expert)
            y = per_pair[token * k + slot]
            out.index_add_(0, token, (y * routing.weights[token, slot, None]).to(x.dtype))
        return out + self.shared.forward(x)

    def _run_local(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The received pairs through their (local) experts, in the order they came."""
        out = torch.empty_like(rows)
        for expert in torch.unique(ids).tolist():
            if expert not in self.local:
                raise ValueError(f"EP rank {self.comm.index} got a token for expert {expert}")
            (which,) = torch.where(ids == expert)
            e = expert - self.local.start
            gate, up = F.linear(rows[which], self.gate_up[e]).chunk(2, dim=-1)
            out[which] = F.linear(F.silu(gate) * up, self.down[e])
        return out


def shard_experts(model: SparseMlaForCausalLM, comm: Comm) -> dict[int, ExpertParallelMoe]:
    """Per MoE layer, this rank's EP shard (none for a group of one: the layers stay local)."""
    if comm.size == 1:
        return {}
    return {
        layer.layer: ExpertParallelMoe(layer.ffn, comm)
        for layer in model.layers
        if isinstance(layer.ffn, MoeFfn)
    }
