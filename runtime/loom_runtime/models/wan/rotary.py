"""Rotary position tables over a latent grid's (frame, row, column) axes, and their application.

Pure functions of the grid and the head size; never holds weights or per-request state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loom_runtime.errors import InvalidRequestError

THETA = 10000.0


@dataclass(frozen=True)
class GridRotary:
    """cos/sin [tokens, head_dim / 2] for each token of a (frames, rows, columns) token grid.

    Each head splits its channels into a frame, a row and a column part (pairs of adjacent
    channels); each part rotates by its own axis position with its own frequencies.
    """

    cos: torch.Tensor
    sin: torch.Tensor


def grid_rotary(
    grid: tuple[int, int, int],
    axes: tuple[int, int, int],
    max_positions: int,
    device: str | torch.device = "cpu",
) -> GridRotary:
    """Tables for a token grid; `axes` are the channels per axis (see WanDitConfig.rope_axes).

    Angles are computed in float64 and the tables stored in float32, as the reference does,
    so a float64 model rotates by exactly the same numbers.
    """
    if max(grid) > max_positions:
        raise InvalidRequestError(
            f"latent token grid {grid} exceeds the {max_positions} rotary positions per axis "
            "the transformer was trained with: request fewer frames or a smaller size"
        )
    parts_cos, parts_sin = [], []
    for axis, (length, channels) in enumerate(zip(grid, axes, strict=True)):
        freqs = 1.0 / THETA ** (
            torch.arange(0, channels, 2, dtype=torch.float64, device=device) / channels
        )
        angles = torch.outer(torch.arange(length, dtype=torch.float64, device=device), freqs)
        shape = [1, 1, 1, angles.shape[1]]
        shape[axis] = length
        angles = angles.view(shape).expand(*grid, angles.shape[1])
        parts_cos.append(angles.cos().float())
        parts_sin.append(angles.sin().float())
    tokens = grid[0] * grid[1] * grid[2]
    cos = torch.cat(parts_cos, dim=-1).reshape(tokens, -1)
    sin = torch.cat(parts_sin, dim=-1).reshape(tokens, -1)
    return GridRotary(cos=cos, sin=sin)


def apply_grid_rotary(x: torch.Tensor, rotary: GridRotary) -> torch.Tensor:
    """Rotate x [batch, tokens, heads, head_dim]; channel pairs (2i, 2i+1) rotate together.

    The product is taken in at least float32 (the tables' dtype) and cast back to x's dtype.
    """
    even, odd = x[..., 0::2], x[..., 1::2]
    cos = rotary.cos[None, :, None, :]
    sin = rotary.sin[None, :, None, :]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)
