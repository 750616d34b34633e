"""The models' matmul against a weight (x @ weightᵀ + bias), in two forms.

`F.linear`, torch's own: a row's result may change in its last bits with the rows that share
the call, because BLAS picks its kernel and blocking by the row count — so a request's logits,
KV and latents depend on what else ran in its step. `invariant_linear`: every call runs as a
batch of fixed tiles of INVARIANT_ROWS rows (the last one padded with zeros), each tile the same
GEMM of the same shape, so a row's result is the same bits whoever shares its step (an engine's
`batch_invariant` setting, `engine.batchInvariant` on a card, with models/invariant_attention.py
for attention; vLLM calls this batch-invariant mode). Its cost is measured by
bench/batch_invariant.py.

Owns the two forms; never decides which one a model uses (the engine does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

Linear = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
"""(x [..., in], weight [out, in], bias [out] or None) -> [..., out]."""

INVARIANT_ROWS = 8
"""Rows per tile: a decode step of one request pays for 8 rows; a long prefill pays little."""


plain_linear: Linear = F.linear
"""torch's own."""


@runtime_checkable
class BatchInvariant(Protocol):
    """A model with a batch-invariant mode (a family that declares `batch_invariant` in
    card/families.py): its matmuls as invariant_linear, its attention likewise invariant."""

    def set_batch_invariant(self, on: bool) -> None:
        """Batch-invariant mode on or off from now on."""
        ...


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ weightᵀ + bias with each row's result independent of the other rows of `x`: the
    rows go through one batched GEMM of [INVARIANT_ROWS, in] tiles, whatever their count."""
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    pad = -n % INVARIANT_ROWS
    if pad:
        rows = torch.cat((rows, rows.new_zeros(pad, rows.shape[1])))
    tiles = rows.view(-1, INVARIANT_ROWS, rows.shape[1])
    out = torch.bmm(tiles, weight.t().expand(tiles.shape[0], -1, -1))
    if bias is not None:
        out = out + bias
    return out.reshape(-1, weight.shape[0])[:n].reshape(*x.shape[:-1], weight.shape[0])
