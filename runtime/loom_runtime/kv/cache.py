"""The paged KV cache tensor: one block-major allocation shared by every layer.

Owns the memory only; which block belongs to whom is the block pool's job.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


class PagedKVCache:
    """KV storage laid out as [num_blocks, num_layers, 2 (k, v), block_size, kv_heads, head_dim].

    Block-major so that one block's KV for all layers is one contiguous region: a P/D pull
    moves whole blocks with one descriptor each.
    """

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

    def layer_blocks(self, layer: int) -> torch.Tensor:
        """[num_blocks, 2 (k, v), block_size, kv_heads, head_dim] view of one layer's KV: one
        index_select over it gathers a set of blocks' keys and values together."""
        return self.data[:, layer]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v ([T, kv_heads, head_dim]) at flat slots (block * block_size + offset)."""
        bs = self.spec.block_size
        blocks, offsets = slots // bs, slots % bs
        self.data[blocks, layer, 0, offsets] = k.to(self.spec.dtype)
        self.data[blocks, layer, 1, offsets] = v.to(self.spec.dtype)
