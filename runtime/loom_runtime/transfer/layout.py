"""KV layouts and the copy plan between two of them: which bytes of the source land where.

Pure arithmetic over block ids and strides (numpy, no torch, no I/O); never moves a byte. Both
transports execute the same plan, so block-size and layout conversion is tested once, here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from loom_runtime.errors import TransferError

Order = Literal["block_major", "layer_major"]
ORDERS: tuple[Order, ...] = ("block_major", "layer_major")
SCALE_BYTES = 4  # one fp32 scale per group of an fp8 head row (kv/fp8.py)


class LayoutError(TransferError):
    """Two KV layouts cannot be mapped onto each other, or a plan asks for blocks not held."""


@dataclass(frozen=True)
class KVLayout:
    """How one worker's KV pool is laid out in one contiguous region.

    `block_major`: [num_blocks, num_layers, 2, block_size, kv_heads, head_dim] (Loom's
    PagedKVCache: one block of every layer is contiguous). `layer_major`: [num_layers, 2,
    num_blocks, block_size, kv_heads, head_dim] (per-layer caches, as vLLM keeps them, in one
    region). A token's heads are contiguous in both: one "row" of kv_heads * head_dim elements.
    An fp8 pool (`scale_group` > 0, dtype "float8_e4m3fn") stores each head's head_dim e4m3
    bytes followed by one fp32 scale per `scale_group` elements; rows move as raw bytes.
    """

    num_blocks: int
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # "float32", "bfloat16", ... (both sides must agree; no conversion)
    elem_bytes: int
    order: Order = "block_major"
    scale_group: int = 0  # fp8: elements per fp32 scale in each head row (0: no scales)

    def __post_init__(self) -> None:
        for name in ("num_blocks", "num_layers", "block_size", "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise LayoutError(f"KVLayout.{name} must be >= 1, got {getattr(self, name)}")
        if self.elem_bytes < 1:
            raise LayoutError(f"KVLayout.elem_bytes must be >= 1, got {self.elem_bytes}")
        if self.order not in ORDERS:
            raise LayoutError(f"KVLayout.order must be one of {ORDERS}, got {self.order!r}")
        if self.scale_group < 0:
            raise LayoutError(f"KVLayout.scale_group must be >= 0, got {self.scale_group}")

    @property
    def row_bytes(self) -> int:
        """Bytes of one token of one layer's K (or V): kv_heads * head_dim elements (plus each
        head's fp32 scales when fp8)."""
        scales = 0 if not self.scale_group else -(-self.head_dim // self.scale_group)
        return self.num_kv_heads * (self.head_dim * self.elem_bytes + scales * SCALE_BYTES)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of every layer, K and V."""
        return self.num_layers * 2 * self.block_size * self.row_bytes

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def strides(self) -> tuple[int, int, int, int]:
        """Byte strides of (block, layer, k/v, token slot)."""
        row, bs = self.row_bytes, self.block_size
        if self.order == "block_major":
            return 2 * self.num_layers * bs * row, 2 * bs * row, bs * row, row
        nb = self.num_blocks
        return bs * row, 2 * nb * bs * row, nb * bs * row, row

    def bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.row_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "num_layers": self.num_layers,
            "block_size": self.block_size,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "elem_bytes": self.elem_bytes,
            "order": self.order,
            "scale_group": self.scale_group,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> KVLayout:
        try:
            return cls(
                num_blocks=int(raw["num_blocks"]),
                num_layers=int(raw["num_layers"]),
                block_size=int(raw["block_size"]),
                num_kv_heads=int(raw["num_kv_heads"]),
                head_dim=int(raw["head_dim"]),
                dtype=str(raw["dtype"]),
                elem_bytes=int(raw["elem_bytes"]),
                order=raw.get("order", "block_major"),
                scale_group=int(raw.get("scale_group", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"malformed KV layout from a peer: {exc!r}") from None


@dataclass(frozen=True)
class CopyPlan:
    """Byte segments: copy `lengths[i]` bytes from source offset `src[i]` to `dst[i]`.

    Offsets are relative to each side's region start; segments are sorted by destination and
    merged wherever both sides are contiguous, so equal layouts move whole runs of blocks.
    """

    src: np.ndarray  # int64 [n]
    dst: np.ndarray  # int64 [n]
    lengths: np.ndarray  # int64 [n]

    @property
    def num_segments(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())


def check_compatible(src: KVLayout, dst: KVLayout) -> None:
    """LayoutError unless every token row of `src` means the same thing in `dst`."""
    fields = ("num_layers", "num_kv_heads", "head_dim", "dtype", "elem_bytes", "scale_group")
    diff = [
        f"{f} {getattr(src, f)} != {getattr(dst, f)}"
        for f in fields
        if getattr(src, f) != getattr(dst, f)
    ]
    if diff:
        raise LayoutError(
            "prefill and decode KV caches hold different things (" + "; ".join(diff) + "); "
            "serve the same model with the same KV dtype on both roles"
        )


def copy_plan(
    src: KVLayout,
    src_blocks: Sequence[int],
    dst: KVLayout,
    dst_blocks: Sequence[int],
    start: int,
    end: int,
) -> CopyPlan:
    """The segments that move tokens start..end-1 (every layer, K and V) from src to dst.

    Token t lives in block `blocks[t // block_size]` at slot `t % block_size` on each side; the
    block sizes and orders of the two sides may differ.
    """
    check_compatible(src, dst)
    if not 0 <= start <= end:
        raise LayoutError(f"bad token range {start}..{end}")
    _check_blocks("source", src, src_blocks, end)
    _check_blocks("destination", dst, dst_blocks, end)
    empty = np.zeros(0, dtype=np.int64)
    if start == end:
        return CopyPlan(empty, empty, empty)
    # Token runs that cross no block boundary on either side.
    cuts = np.union1d(
        _multiples(start, end, src.block_size), _multiples(start, end, dst.block_size)
    )
    bounds = np.union1d(cuts, np.array([start, end], dtype=np.int64))
    run_start, run_len = bounds[:-1], np.diff(bounds)
    src_off = _offsets(src, np.asarray(src_blocks, dtype=np.int64), run_start)
    dst_off = _offsets(dst, np.asarray(dst_blocks, dtype=np.int64), run_start)
    lengths = np.broadcast_to((run_len * src.row_bytes)[:, None], src_off.shape).reshape(-1)
    return _merge(src_off.reshape(-1), dst_off.reshape(-1), lengths)


def _check_blocks(side: str, layout: KVLayout, blocks: Sequence[int], end: int) -> None:
    needed = -(-end // layout.block_size)
    if len(blocks) < needed:
        raise LayoutError(
            f"{side} holds {len(blocks)} blocks of {layout.block_size} tokens, but tokens up to "
            f"{end} need {needed}"
        )
    if needed and (min(blocks[:needed]) < 0 or max(blocks[:needed]) >= layout.num_blocks):
        raise LayoutError(f"{side} block id outside 0..{layout.num_blocks - 1}")


def _multiples(start: int, end: int, step: int) -> np.ndarray:
    first = (start // step + 1) * step
    return np.arange(first, end, step, dtype=np.int64)


def _offsets(layout: KVLayout, blocks: np.ndarray, run_start: np.ndarray) -> np.ndarray:
    """[runs, layers * 2] byte offsets of each run's first token, for every layer and K/V."""
    block_s, layer_s, kv_s, tok_s = layout.strides()
    base = (
        blocks[run_start // layout.block_size] * block_s + (run_start % layout.block_size) * tok_s
    )
    lk = np.arange(layout.num_layers * 2, dtype=np.int64)
    out: np.ndarray = base[:, None] + ((lk // 2) * layer_s + (lk % 2) * kv_s)[None, :]
    return out


def _merge(src: np.ndarray, dst: np.ndarray, lengths: np.ndarray) -> CopyPlan:
    order = np.argsort(dst, kind="stable")
    src, dst, lengths = src[order], dst[order], lengths[order]
    joins = (src[:-1] + lengths[:-1] == src[1:]) & (dst[:-1] + lengths[:-1] == dst[1:])
    heads = np.flatnonzero(np.concatenate(([True], ~joins)))
    return CopyPlan(src[heads], dst[heads], np.add.reduceat(lengths, heads))


def apply_plan(plan: CopyPlan, src: memoryview, dst: memoryview) -> None:
    """Execute a plan between two byte buffers in this process (the reference the transports
    must match, and the in-process fallback)."""
    for s, d, n in zip(plan.src.tolist(), plan.dst.tolist(), plan.lengths.tolist(), strict=True):
        dst[d : d + n] = src[s : s + n]
