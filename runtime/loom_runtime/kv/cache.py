"""The paged KV cache tensor: one block-major allocation shared by every layer, and the small
protocol (KVSpec / KVStore) every family's paged cache follows.

Owns the memory only; which block belongs to whom is the block pool's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


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
    """Shape of one worker's KV cache. A block holds `block_size` tokens of every layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    dtype: torch.dtype = torch.float32

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim * elem

    def allocate(self, device: torch.device | str = "cpu") -> PagedKVCache:
        return PagedKVCache(self, device)


class PagedKVCache:
    """KV storage laid out as [num_blocks, num_layers, 2 (k, v), block_size, kv_heads, head_dim].

    Block-major so that one block's KV for all layers is one contiguous region: a P/D pull
    moves whole blocks with one descriptor each.
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
            spec.head_dim,
            dtype=spec.dtype,
            device=device,
        )
        # Flat views of the same memory: one row per (block, layer, k|v) half-block, and one
        # row per token slot of each half-block. Gathers and writes index these contiguous
        # views, so each moves whole rows with memcpy instead of striding element by element.
        self._halves = self.data.view(spec.num_blocks * spec.num_layers * 2, -1)
        self._slots = self.data.view(-1, spec.num_kv_heads, spec.head_dim)

    def gather(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `blocks` (int64 [N]) in one layer, each a contiguous
        [N * block_size, kv_heads, head_dim] copy: block 0's tokens, then block 1's, ..."""
        spec = self.spec
        first = blocks * (spec.num_layers * 2) + layer * 2
        shape = (-1, spec.num_kv_heads, spec.head_dim)
        keys = self._halves.index_select(0, first).view(shape)
        values = self._halves.index_select(0, first + 1).view(shape)
        return keys, values

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v ([T, kv_heads, head_dim]) at flat slots (block * block_size + offset)."""
        bs = self.spec.block_size
        blocks, offsets = slots // bs, slots % bs
        rows = (blocks * (self.spec.num_layers * 2) + layer * 2) * bs + offsets
        self._slots.index_copy_(0, rows, k.to(self.spec.dtype))
        self._slots.index_copy_(0, rows + bs, v.to(self.spec.dtype))
