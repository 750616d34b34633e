"""The log-sum-exp merge of partial attention outputs: with per-rank outputs o_i and LSEs l_i,
m = max l_i, L = m + log Σ exp(l_i − m), o = Σ exp(l_i − L)·o_i; a NaN or +inf LSE counts as
−inf (a rank that saw no row adds nothing), and so does its output, NaN or not.

Pure tensor math over stacked partials; never communicates (dcp_attention.py does).
"""

from __future__ import annotations

import torch


def sanitize(lse: torch.Tensor) -> torch.Tensor:
    """NaN and +inf LSEs become −inf."""
    bad = torch.isnan(lse) | torch.isposinf(lse)
    return lse.masked_fill(bad, float("-inf"))


def merged_lse(lses: torch.Tensor) -> torch.Tensor:
    """L over the first dim of `lses` ([W, ...]); −inf where every part is −inf."""
    lses = sanitize(lses)
    top = lses.amax(dim=0)
    shift = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
    total = shift + torch.log(torch.exp(lses - shift).sum(dim=0))
    return torch.where(torch.isneginf(top), top, total)


def rescale(output: torch.Tensor, lse: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """exp(l − L)·o for one part (output [..., D], lse and total [...]); exactly 0 where the
    part is empty (l = −inf) so a NaN output of an empty part cannot leak."""
    lse = sanitize(lse)
    empty = torch.isneginf(lse) | torch.isneginf(total)
    weight = torch.exp(torch.where(empty, torch.zeros_like(lse), lse - total))
    scaled = output * weight[..., None].to(output.dtype)
    return torch.where(empty[..., None], torch.zeros_like(scaled), scaled)


def merge(outputs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) from stacked parts: outputs [W, ..., D], lses [W, ...]; summed in part order."""
    total = merged_lse(lses)
    out = rescale(outputs[0], lses[0], total)
    for i in range(1, outputs.shape[0]):
        out = out + rescale(outputs[i], lses[i], total)
    return out, total
