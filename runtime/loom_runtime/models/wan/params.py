"""Plain weight holders (linear layers) that name their checkpoint tensors, and the wide dtype rule.

Holds zero-initialised tensors filled by a loader; never reads files or keeps autograd state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where half-precision models keep norms, modulation and residual sums: float32.

    Float32 and float64 models stay as they are.
    """
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class Linear:
    """y = x @ weight.T + bias, with weight [out, in] as checkpoints store it."""

    def __init__(
        self,
        out_features: int,
        in_features: int,
        dtype: torch.dtype,
        device: str | torch.device,
        bias: bool = True,
    ) -> None:
        self.weight = torch.zeros(out_features, in_features, dtype=dtype, device=device)
        self.bias = torch.zeros(out_features, dtype=dtype, device=device) if bias else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def targets(self, name: str) -> dict[str, torch.Tensor]:
        """`name.weight` (and `name.bias`) -> the tensor each is copied into."""
        out = {f"{name}.weight": self.weight}
        if self.bias is not None:
            out[f"{name}.bias"] = self.bias
        return out
