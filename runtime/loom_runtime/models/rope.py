"""Rotary position embeddings: inverse frequencies for each scaling type, and their application.

Pure functions of the config and positions; frequencies are computed in float32 exactly as
Hugging Face does, so logits match it. Never caches per-request state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class RopeTables:
    """cos and sin ([T, 1, head_dim], in the model dtype) for the T tokens of one forward."""

    cos: torch.Tensor
    sin: torch.Tensor


def inverse_frequencies(
    head_dim: int,
    theta: float,
    scaling: Mapping[str, Any] | None,
    max_position_embeddings: int,
) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim // 2] float32, attention scale applied to cos and sin).

    `dynamic` NTK is applied statically at max_position_embeddings * factor (as vLLM does):
    frequencies must not change while a sequence's keys sit in the cache.
    """
    base = _base_inv_freq(head_dim, theta)
    rope_type = None if scaling is None else scaling["rope_type"]
    if scaling is None:
        return base, 1.0
    if rope_type == "linear":
        return base / float(scaling["factor"]), 1.0
    if rope_type == "llama3":
        return _llama3(base, scaling), 1.0
    if rope_type == "dynamic":
        factor = float(scaling["factor"])
        seq_len = max_position_embeddings * factor
        ratio = factor * seq_len / max_position_embeddings - (factor - 1)
        return _base_inv_freq(head_dim, theta * ratio ** (head_dim / (head_dim - 2))), 1.0
    if rope_type == "yarn":
        return _yarn(head_dim, theta, scaling, max_position_embeddings)
    raise ValueError(f"unsupported rope type {rope_type!r}")


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
) -> RopeTables:
    """cos/sin for `positions` ([T] int64), computed in float32 then cast to `dtype`."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * scale).to(dtype)
    sin = (emb.sin() * scale).to(dtype)
    return RopeTables(cos=cos[:, None, :], sin=sin[:, None, :])


def apply_rope(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """Rotate x ([T, heads, head_dim]) by its positions, half-split (NeoX / HF layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * tables.cos + rotated * tables.sin


def _base_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponents)


def _llama3(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(
    dim: int, theta: float, scaling: Mapping[str, Any], max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    original = float(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor") or max_position_embeddings / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention_factor = _yarn_mscale(factor, 1.0)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
