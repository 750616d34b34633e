"""RMSNorm as a function: the one normalisation the llama family uses.

Pure arithmetic; never holds weights.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise the last dim of x by its RMS, then scale by weight.

    Half-precision inputs are normalised in float32 and cast back before the weight is applied,
    as Hugging Face does, so bf16 logits match it.
    """
    dtype = x.dtype
    h = x.float() if dtype in (torch.float16, torch.bfloat16) else x
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)
