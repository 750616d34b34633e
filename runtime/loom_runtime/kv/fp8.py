"""FP8 KV rows: e4m3 values with one fp32 scale per group of elements, packed into uint8 rows
(a llama head row, the 656-byte sparse-MLA row, the 132-byte indexer row of REFERENCE.md §A).

Owns the number format and the byte layout of a row only; never allocates a cache or picks slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3 = torch.float8_e4m3fn
E4M3_NAME = "float8_e4m3fn"  # how a KV layout names the format to a P/D peer
E4M3_MAX = 448.0  # the largest finite e4m3fn value
SCALE_BYTES = 4  # one fp32 scale per group (the planner's kv_layout.SCALE_BYTES)
ROPE_DTYPE = torch.bfloat16  # MLA's decoupled RoPE dims stay BF16 next to an fp8 latent


@dataclass(frozen=True)
class Fp8Format:
    """FP8 KV storage: e4m3 values, one fp32 scale (amax / 448) per `group_size` elements of a
    row; a row's last group may be shorter. `group_size` is the card's `quantGroupSize`."""

    group_size: int = 128

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"Fp8Format.group_size must be >= 1, got {self.group_size}")

    def num_groups(self, elements: int) -> int:
        return -(-elements // self.group_size)

    def row_bytes(self, elements: int) -> int:
        """Bytes of one packed row of `elements` values: e4m3 values, then the fp32 scales."""
        return elements + self.num_groups(elements) * SCALE_BYTES

    def elements_in_row(self, row_bytes: int) -> int:
        """The `elements` whose packed row is `row_bytes` long (ValueError if none is)."""
        groups = -(-row_bytes // (self.group_size + SCALE_BYTES))
        elements = row_bytes - groups * SCALE_BYTES
        if elements < 1 or self.row_bytes(elements) != row_bytes:
            raise ValueError(f"no fp8 row of groups of {self.group_size} is {row_bytes} bytes long")
        return elements

    def mla_row_bytes(self, latent_dim: int, rope_dim: int) -> int:
        """Bytes of one sparse-MLA row: the packed latent, then the BF16 RoPE dims (656 for
        kv_lora_rank 512, qk_rope_head_dim 64, groups of 128)."""
        return self.row_bytes(latent_dim) + rope_dim * ROPE_DTYPE.itemsize


def quantize(x: torch.Tensor, fmt: Fp8Format) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values [..., n], fp32 scales [..., groups]) of x [..., n]: each group is divided
    by its scale amax / 448 in fp32 and rounded to nearest even; an all-zero group has scale 0
    and zero values."""
    n, g = x.shape[-1], fmt.group_size
    groups = fmt.num_groups(n)
    padded = torch.nn.functional.pad(x.to(torch.float32), (0, groups * g - n))
    grouped = padded.reshape(*x.shape[:-1], groups, g)
    scales = grouped.abs().amax(dim=-1) / E4M3_MAX
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))
    scaled = (grouped / divisor[..., None]).clamp(-E4M3_MAX, E4M3_MAX)
    values = scaled.to(E4M3).reshape(*x.shape[:-1], groups * g)[..., :n]
    return values, scales


def dequantize(values: torch.Tensor, scales: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """fp32 [..., n] of e4m3 values [..., n] and their fp32 scales [..., groups]."""
    n = values.shape[-1]
    per_element = scales.repeat_interleave(fmt.group_size, dim=-1)[..., :n]
    return values.to(torch.float32) * per_element


def pack(x: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """uint8 [..., fmt.row_bytes(n)] of x [..., n]: the e4m3 bytes, then the scales' fp32
    bytes (native byte order)."""
    values, scales = quantize(x, fmt)
    return torch.cat((_bytes(values), _bytes(scales)), dim=-1)


def unpack(rows: torch.Tensor, elements: int, fmt: Fp8Format) -> torch.Tensor:
    """fp32 [..., elements] of packed uint8 rows [..., fmt.row_bytes(elements)]."""
    _check_width(rows, fmt.row_bytes(elements))
    values = rows[..., :elements].contiguous().view(E4M3)
    scales = rows[..., elements:].contiguous().view(torch.float32)
    return dequantize(values, scales, fmt)


def pack_mla(latent: torch.Tensor, rope: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """uint8 [..., mla_row_bytes] of latent [..., latent_dim] and rope [..., rope_dim]: the
    packed latent (e4m3 values, fp32 scales), then the RoPE dims in BF16."""
    return torch.cat((pack(latent, fmt), _bytes(rope.to(ROPE_DTYPE))), dim=-1)


def unpack_mla(
    rows: torch.Tensor, latent_dim: int, rope_dim: int, fmt: Fp8Format
) -> tuple[torch.Tensor, torch.Tensor]:
    """(latent fp32 [..., latent_dim], rope BF16 [..., rope_dim]) of packed sparse-MLA rows."""
    _check_width(rows, fmt.mla_row_bytes(latent_dim, rope_dim))
    cut = fmt.row_bytes(latent_dim)
    latent = unpack(rows[..., :cut], latent_dim, fmt)
    rope = rows[..., cut:].contiguous().view(ROPE_DTYPE)
    return latent, rope


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """The bytes of x [..., n] as uint8 [..., n * itemsize] (a view when x is contiguous)."""
    return x.contiguous().view(torch.uint8)


def _check_width(rows: torch.Tensor, width: int) -> None:
    if rows.dtype != torch.uint8 or rows.shape[-1] != width:
        raise ValueError(
            f"packed fp8 rows must be uint8 [..., {width}], got {rows.dtype} {tuple(rows.shape)}"
        )
