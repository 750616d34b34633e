"""KV layouts and the copy plan between two of them: which bytes of the source land where.

A layout describes a block as fixed-size per-token row planes (a head cache's K and V of every
layer; a latent cache's latent rows and indexer rows), and one planner maps any two layouts of
the same kind. Pure arithmetic over block ids and strides (numpy, no torch, no I/O); never
moves a byte. Both transports execute the same plan, so conversion is tested once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from loom_runtime.errors import TransferError

Order = Literal["block_major", "layer_major"]
ORDERS: tuple[Order, ...] = ("block_major", "layer_major")
SCALE_BYTES = 4  # one fp32 scale per group of an fp8 row (kv/fp8.py)
ROPE_BYTES = 2  # a packed sparse-MLA row keeps its RoPE dims in BF16 (kv/fp8.py)


class LayoutError(TransferError):
    """Two KV layouts cannot be mapped onto each other, or a plan asks for blocks not held."""


@dataclass(frozen=True)
class Planes:
    """Where each per-token row plane of a layout lies: token t of block b in plane p starts at
    byte `base[p] + b * block_stride[p] + t * row_bytes[p]` (int64 arrays, one entry a plane)."""

    row_bytes: np.ndarray
    base: np.ndarray
    block_stride: np.ndarray


class BlockLayout(Protocol):
    """What the planner and the transports need of a layout (KVLayout, LatentLayout)."""

    @property
    def kind(self) -> str: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def block_bytes(self) -> int: ...

    @property
    def total_bytes(self) -> int: ...

    def planes(self) -> Planes: ...

    def meaning(self) -> dict[str, Any]:
        """Every field that must match on both sides for a row to mean the same thing."""
        ...

    def bytes_per_token(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


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

    kind = "heads"

    def __post_init__(self) -> None:
        _check_positive(self, ("num_blocks", "num_layers", "block_size", "num_kv_heads"))
        _check_positive(self, ("head_dim", "elem_bytes"))
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

    def planes(self) -> Planes:
        """Plane 2 * layer + (0: K, 1: V); a block of a plane is block_size contiguous rows."""
        n, row, bs = self.num_layers * 2, self.row_bytes, self.block_size
        span = bs * row if self.order == "block_major" else self.num_blocks * bs * row
        stride = self.block_bytes if self.order == "block_major" else bs * row
        return _planes([row] * n, [p * span for p in range(n)], [stride] * n)

    def meaning(self) -> dict[str, Any]:
        fields = ("num_layers", "num_kv_heads", "head_dim", "dtype", "elem_bytes", "scale_group")
        return {f: getattr(self, f) for f in fields}

    def bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.row_bytes

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> KVLayout:
        return _from_dict(cls, raw, "KV layout")


@dataclass(frozen=True)
class LatentLayout:
    """A sparse-MLA latent pool (kv/latent_cache.py), block-major: block b is `num_layers` planes
    of block_size latent + RoPE rows, then one plane of block_size indexer key rows for each
    layer in `index_layers`. Plain rows hold latent_dim + rope_dim (or index_dim) elements of
    `dtype`; fp8 rows (`scale_group` > 0, dtype "float8_e4m3fn") are the packed bytes of
    kv/fp8.py (e4m3 latent, fp32 scales, BF16 RoPE), moved as they are.
    """

    num_blocks: int
    num_layers: int
    block_size: int
    latent_dim: int
    rope_dim: int
    index_layers: tuple[int, ...]
    index_dim: int
    dtype: str
    elem_bytes: int
    scale_group: int = 0

    kind = "latent"

    def __post_init__(self) -> None:
        _check_positive(self, ("num_blocks", "num_layers", "block_size", "latent_dim"))
        _check_positive(self, ("rope_dim", "index_dim", "elem_bytes"))
        if self.scale_group < 0:
            raise LayoutError(f"LatentLayout.scale_group must be >= 0, got {self.scale_group}")
        if any(not 0 <= i < self.num_layers for i in self.index_layers):
            raise LayoutError(
                f"LatentLayout.index_layers {self.index_layers} must lie in "
                f"0..{self.num_layers - 1}"
            )

    @property
    def latent_row_bytes(self) -> int:
        """Bytes of one token's latent + RoPE row in one layer."""
        if not self.scale_group:
            return (self.latent_dim + self.rope_dim) * self.elem_bytes
        return _fp8_row(self.latent_dim, self.scale_group) + self.rope_dim * ROPE_BYTES

    @property
    def index_row_bytes(self) -> int:
        """Bytes of one token's indexer key row in one indexer layer."""
        if not self.scale_group:
            return self.index_dim * self.elem_bytes
        return _fp8_row(self.index_dim, self.scale_group)

    def bytes_per_token(self) -> int:
        index = len(self.index_layers) * self.index_row_bytes
        return self.num_layers * self.latent_row_bytes + index

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.bytes_per_token()

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def planes(self) -> Planes:
        """Planes 0..num_layers-1: latent rows; then one per indexer layer, in their order."""
        bs, lat, idx = self.block_size, self.latent_row_bytes, self.index_row_bytes
        rows = [lat] * self.num_layers + [idx] * len(self.index_layers)
        base = [p * bs * lat for p in range(self.num_layers)]
        base += [self.num_layers * bs * lat + i * bs * idx for i in range(len(self.index_layers))]
        return _planes(rows, base, [self.block_bytes] * len(rows))

    def meaning(self) -> dict[str, Any]:
        fields = ("num_layers", "latent_dim", "rope_dim", "index_layers", "index_dim")
        return {f: getattr(self, f) for f in (*fields, "dtype", "elem_bytes", "scale_group")}

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LatentLayout:
        return _from_dict(cls, raw, "latent KV layout")


# How a handshake's values become each field's type (fields are annotated as strings).
_DECODE: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "str": str,
    "Order": str,
    "tuple[int, ...]": lambda v: tuple(int(i) for i in v),
}
_Layout = TypeVar("_Layout", KVLayout, LatentLayout)


def _to_dict(layout: KVLayout | LatentLayout) -> dict[str, Any]:
    """The handshake's map: the kind, then every field (tuples as lists)."""
    out: dict[str, Any] = {"kind": layout.kind}
    for f in fields(layout):
        value = getattr(layout, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def _from_dict(cls: type[_Layout], raw: Mapping[str, Any], what: str) -> _Layout:
    """A layout from a peer's map; a field it lacks takes its default (older peers)."""
    try:
        values = {}
        for f in fields(cls):
            if f.name in raw:
                values[f.name] = _DECODE[str(f.type)](raw[f.name])
            elif f.default is MISSING:
                raise KeyError(f.name)
        return cls(**values)
    except (KeyError, TypeError, ValueError) as exc:
        raise LayoutError(f"malformed {what} from a peer: {exc!r}") from None


_KINDS = {"heads": "a paged head cache (llama-style K/V)", "latent": "a latent cache (sparse-mla)"}


def layout_from_dict(raw: Mapping[str, Any]) -> KVLayout | LatentLayout:
    """A peer's layout from its handshake; one without "kind" predates latent layouts (heads)."""
    kind = raw.get("kind", "heads")
    if kind == "heads":
        return KVLayout.from_dict(raw)
    if kind == "latent":
        return LatentLayout.from_dict(raw)
    raise LayoutError(
        f"a peer sent a KV layout of unknown kind {kind!r} (known: {', '.join(_KINDS)}); "
        "serve both roles with the same Loom version"
    )


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


def check_compatible(src: BlockLayout, dst: BlockLayout) -> None:
    """LayoutError unless every token row of `src` means the same thing in `dst`."""
    if src.kind != dst.kind:
        raise LayoutError(
            f"the prefill holds {_KINDS.get(src.kind, src.kind)} but this decode holds "
            f"{_KINDS.get(dst.kind, dst.kind)}; serve the same model on both roles"
        )
    theirs, ours = src.meaning(), dst.meaning()
    diff = [f"{f} {theirs[f]} != {ours[f]}" for f in theirs if theirs[f] != ours.get(f)]
    if diff:
        raise LayoutError(
            "prefill and decode KV caches hold different things (" + "; ".join(diff) + "); "
            "serve the same model with the same KV dtype and MTP setting (mtp.draftTokens) on "
            "both roles"
        )


def copy_plan(
    src: BlockLayout,
    src_blocks: Sequence[int],
    dst: BlockLayout,
    dst_blocks: Sequence[int],
    start: int,
    end: int,
) -> CopyPlan:
    """The segments that move tokens start..end-1 (every row plane) from src to dst.

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
    lengths = run_len[:, None] * src.planes().row_bytes[None, :]
    return _merge(src_off.reshape(-1), dst_off.reshape(-1), lengths.reshape(-1))


def _check_blocks(side: str, layout: BlockLayout, blocks: Sequence[int], end: int) -> None:
    needed = -(-end // layout.block_size)
    if len(blocks) < needed:
        raise LayoutError(
            f"{side} holds {len(blocks)} blocks of {layout.block_size} tokens, but tokens up to "
            f"{end} need {needed}"
        )
    if needed and (min(blocks[:needed]) < 0 or max(blocks[:needed]) >= layout.num_blocks):
        raise LayoutError(f"{side} block id outside 0..{layout.num_blocks - 1}")


def _check_positive(layout: object, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(layout, name) < 1:
            kind = type(layout).__name__
            raise LayoutError(f"{kind}.{name} must be >= 1, got {getattr(layout, name)}")


def _planes(rows: list[int], base: list[int], stride: list[int]) -> Planes:
    return Planes(*(np.asarray(xs, dtype=np.int64) for xs in (rows, base, stride)))


def _fp8_row(elements: int, group: int) -> int:
    """Bytes of a packed fp8 row (kv/fp8.py): e4m3 values, then one fp32 scale per group."""
    return elements + -(-elements // group) * SCALE_BYTES


def _multiples(start: int, end: int, step: int) -> np.ndarray:
    first = (start // step + 1) * step
    return np.arange(first, end, step, dtype=np.int64)


def _offsets(layout: BlockLayout, blocks: np.ndarray, run_start: np.ndarray) -> np.ndarray:
    """[runs, planes] byte offsets of each run's first token, in every row plane."""
    planes = layout.planes()
    block = blocks[run_start // layout.block_size][:, None]
    slot = (run_start % layout.block_size)[:, None]
    out: np.ndarray = planes.base + block * planes.block_stride + slot * planes.row_bytes
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
