"""Elementwise math whose result for an element does not depend on the tensor around it.

torch's CPU kernels run an elementwise function in SIMD chunks and the remainder at the end of
the tensor by another path (a scalar or partial-vector exp, sigmoid, cos), whose last bits can
differ: so a row of 8 router scores gets other bits in a batch of 1 (all remainder) than in a
batch of 4. `each_element` pads the last dimension to a multiple of ROW_ALIGN, so every row's
elements take the chunked path, whatever the row count (batch-invariant mode).

Owns that padding; never chooses where it is used (the models do).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

ROW_ALIGN = 64
"""A multiple of every SIMD chunk torch's CPU kernels use (2 vectors of up to 16 floats)."""


def each_element(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an elementwise fn, each element's bits independent of x's other rows."""
    width = x.shape[-1]
    pad = -width % ROW_ALIGN
    if pad == 0:
        return fn(x)
    return fn(F.pad(x, (0, pad)))[..., :width]
