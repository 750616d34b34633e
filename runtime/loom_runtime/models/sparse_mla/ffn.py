"""The feed-forward blocks: a dense SwiGLU MLP, and the MoE of routed + shared SwiGLU experts.

Owns the FFN weights and math; never decides routing itself (gating.py does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loom_runtime.models.linear import Linear, invariant_linear, plain_linear
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.gating import route


class SwiGluMlp:
    """down(silu(gate(x)) * up(x)); gate and up stored fused, one matmul."""

    def __init__(
        self, hidden: int, intermediate: int, dtype: torch.dtype, device: str | torch.device
    ):
        self.intermediate = intermediate
        self.gate_up = torch.zeros(2 * intermediate, hidden, dtype=dtype, device=device)
        self.down = torch.zeros(hidden, intermediate, dtype=dtype, device=device)
        self.linear: Linear = plain_linear  # invariant_linear in batch-invariant mode

    def targets(self) -> dict[str, torch.Tensor]:
        i = self.intermediate
        return {
            "gate_proj.weight": self.gate_up[:i],
            "up_proj.weight": self.gate_up[i:],
            "down_proj.weight": self.down,
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.linear(x, self.gate_up, None).chunk(2, dim=-1)
        return self.linear(F.silu(gate) * up, self.down, None)


class MoeFfn:
    """Each token runs its k routed experts (weighted by the gate) plus the shared expert."""

    def __init__(self, config: SparseMlaConfig, dtype: torch.dtype, device: str | torch.device):
        self.config = config
        c = config
        h, i, e = c.hidden_size, c.moe_intermediate_size, c.n_routed_experts
        self.gate = torch.zeros(e, h, dtype=dtype, device=device)
        self.correction_bias = torch.zeros(e, dtype=torch.float32, device=device)
        self.experts_gate_up = torch.zeros(e, 2 * i, h, dtype=dtype, device=device)
        self.experts_down = torch.zeros(e, h, i, dtype=dtype, device=device)
        self.shared = SwiGluMlp(h, i * c.n_shared_experts, dtype, device)
        self.linear: Linear = plain_linear  # the experts'
        self.invariant = False  # batch-invariant mode: the router's too

    def set_batch_invariant(self, on: bool) -> None:
        self.linear = self.shared.linear = invariant_linear if on else plain_linear
        self.invariant = on

    def targets(self) -> dict[str, torch.Tensor]:
        """Hugging Face tensor name (below `mlp.`) -> the tensor (view) it fills."""
        i = self.config.moe_intermediate_size
        out = {"gate.weight": self.gate, "gate.e_score_correction_bias": self.correction_bias}
        for e in range(self.config.n_routed_experts):
            out[f"experts.{e}.gate_proj.weight"] = self.experts_gate_up[e, :i]
            out[f"experts.{e}.up_proj.weight"] = self.experts_gate_up[e, i:]
            out[f"experts.{e}.down_proj.weight"] = self.experts_down[e]
        out.update({f"shared_experts.{k}": v for k, v in self.shared.targets().items()})
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routing = route(x, self.gate, self.correction_bias, self.config, self.invariant)
        out = torch.zeros_like(x)
        for expert in torch.unique(routing.experts).tolist():
            tokens, slot = torch.where(routing.experts == expert)
            gate, up = self.linear(x[tokens], self.experts_gate_up[expert], None).chunk(2, dim=-1)
            y = self.linear(F.silu(gate) * up, self.experts_down[expert], None)
            out.index_add_(0, tokens, (y * routing.weights[tokens, slot, None]).to(x.dtype))
        return out + self.shared.forward(x)
