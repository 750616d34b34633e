"""Interleaved RoPE (DeepSeek / GLM layout) for the decoupled RoPE dims of MLA and the indexer.

Pure functions of positions and frequencies; never caches per-request state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loom_runtime.models.elementwise import each_element
from loom_runtime.models.rope import inverse_frequencies


@dataclass(frozen=True)
class PairTables:
    """cos and sin ([T, 1, rope_dim // 2], model dtype): one angle per rotated pair."""

    cos: torch.Tensor
    sin: torch.Tensor


def pair_tables(
    positions: torch.Tensor,
    rope_dim: int,
    theta: float,
    dtype: torch.dtype,
    invariant: bool = False,
) -> PairTables:
    """Angles computed in float32 (as Hugging Face does), then cast to the model dtype;
    `invariant`: each position's the same bits whatever positions share the call."""
    inv_freq, _ = inverse_frequencies(rope_dim, theta, None, 0)
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    cos, sin = (each_element(f, angles) if invariant else f(angles) for f in (torch.cos, torch.sin))
    return PairTables(cos=cos.to(dtype)[:, None], sin=sin.to(dtype)[:, None])


def rotate_pairs(x: torch.Tensor, tables: PairTables) -> torch.Tensor:
    """Rotate the pairs (x0, x1), (x2, x3), ... of x ([T, heads, rope_dim]).

    The result is laid out de-interleaved (all first members, then all second members);
    queries and keys both get that layout, so their dot products are those of the pairs.
    """
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = tables.cos, tables.sin
    return torch.cat((even * cos - odd * sin, odd * cos + even * sin), dim=-1)
