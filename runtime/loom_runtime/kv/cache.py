"""The paged KV cache tensor: one block-major allocation shared by every layer, and the small
protocol (KVSpec / KVStore) every family's paged cache follows.

Owns the memory only; which block belongs to whom is the block pool's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from loom_runtime.kv.fp8 import Fp8Format, pack, unpack


class KVStore(Protocol):
    """A family's paged KV cache as the engine sees it: its spec and its one block-major tensor
    (`data[b]` is block b's bytes, one contiguous region). `transferable`: the P/D connector
    knows how to move its blocks."""

    data: torch.Tensor

    @property
    def spec(self) -> KVSpec: ...

    @property
    def transferable(self) -> bool: ...


class KVSpec(Protocol):
    """The shape of a family's paged KV cache: enough to size the pool and allocate it."""

    @property
    def block_size(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def bytes_per_block(self) -> int: ...

    def allocate(self, device: torch.device | str = "cpu") -> KVStore:
        """The zeroed cache of this shape on `device`."""
        ...


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of one worker's KV cache. A block holds `block_size` tokens of every layer. With
    `fp8`, each head's K or V row is stored packed (kv/fp8.py: head_dim e4m3 bytes, then an fp32
    scale per group) and `dtype` is only the dtype rows are gathered in."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    dtype: torch.dtype = torch.float32
    fp8: Fp8Format | None = None  # None: rows stored in `dtype`

    @property
    def storage_dtype(self) -> torch.dtype:
        return self.dtype if self.fp8 is None else torch.uint8

    @property
    def stored_head_width(self) -> int:
        """Stored elements (bytes when fp8) of one head's K or V row of one token."""
        return self.head_dim if self.fp8 is None else self.fp8.row_bytes(self.head_dim)

    @property
    def bytes_per_block(self) -> int:
        row = self.num_kv_heads * self.stored_head_width * self.storage_dtype.itemsize
        return self.num_layers * 2 * self.block_size * row

    def allocate(self, device: torch.device | str = "cpu") -> PagedKVCache:
        return PagedKVCache(self, device)


class PagedKVCache:
    """KV storage laid out as [num_blocks, num_layers, 2 (k, v), block_size, kv_heads, head_dim].

    Block-major so that one block's KV for all layers is one contiguous region: a P/D pull
    moves whole blocks with one descriptor each. With fp8 the last dimension is each head's
    packed row (uint8): rows are quantised on write and dequantised on gather, and a P/D pull
    moves the packed bytes, scales included, as they are.
    """

    transferable = True  # the P/D connector's layout (transfer/layout.py)

    def __init__(self, spec: KVCacheSpec, device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.data = torch.zeros(
            spec.num_blocks,
            spec.num_layers,
            2,
            spec.block_size,
            spec.num_kv_heads,
            spec.stored_head_width,
            dtype=spec.storage_dtype,
            device=device,
        )
        # Flat views of the same memory: one row per (block, layer, k|v) half-block, and one
        # row per token slot of each half-block. Gathers and writes index these contiguous
        # views, so each moves whole rows with memcpy instead of striding element by element.
        self._halves = self.data.view(spec.num_blocks * spec.num_layers * 2, -1)
        self._slots = self.data.view(-1, spec.num_kv_heads, spec.stored_head_width)

    def gather(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `blocks` (int64 [N]) in one layer, each a contiguous
        [N * block_size, kv_heads, head_dim] copy: block 0's tokens, then block 1's, ..."""
        spec = self.spec
        first = blocks * (spec.num_layers * 2) + layer * 2
        shape = (-1, spec.num_kv_heads, spec.stored_head_width)
        keys = self._halves.index_select(0, first).view(shape)
        values = self._halves.index_select(0, first + 1).view(shape)
        if spec.fp8 is None:
            return keys, values
        return self._decode(keys), self._decode(values)

    def gather_blocks(self, layer: int, blocks: torch.Tensor) -> torch.Tensor:
        """Keys and values of `blocks` (int64 [N]) in one layer, block by block, as one
        contiguous [N, 2 (k, v), block_size, kv_heads, head_dim] copy (dequantised when fp8):
        the pool's own layout for one layer, read with one gather."""
        spec = self.spec
        first = blocks * (spec.num_layers * 2) + layer * 2
        halves = torch.stack((first, first + 1), dim=1).flatten()
        rows = self._halves.index_select(0, halves).view(
            -1, spec.num_kv_heads, spec.stored_head_width
        )
        if spec.fp8 is not None:
            rows = self._decode(rows)
        return rows.view(len(blocks), 2, spec.block_size, spec.num_kv_heads, spec.head_dim)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v ([T, kv_heads, head_dim]) at flat slots (block * block_size + offset)."""
        bs = self.spec.block_size
        blocks, offsets = slots // bs, slots % bs
        rows = (blocks * (self.spec.num_layers * 2) + layer * 2) * bs + offsets
        self._slots.index_copy_(0, rows, self._encode(k))
        self._slots.index_copy_(0, rows + bs, self._encode(v))

    def as_stored(self, x: torch.Tensor) -> torch.Tensor:
        """Rows x ([T, kv_heads, head_dim]) as a gather returns them once written: x itself in
        the cache's dtype, or rounded through fp8. Attention over a fresh chunk reads these, so
        fp8 results do not depend on how a prompt was chunked or split between P and D."""
        return x.to(self.spec.dtype) if self.spec.fp8 is None else self._decode(self._encode(x))

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        fp8 = self.spec.fp8
        return x.to(self.spec.dtype) if fp8 is None else pack(x, fp8)

    def _decode(self, rows: torch.Tensor) -> torch.Tensor:
        assert self.spec.fp8 is not None
        return unpack(rows, self.spec.head_dim, self.spec.fp8).to(self.spec.dtype)
