"""The paged latent KV cache of the sparse-MLA family: per token, every layer's latent + RoPE
row and every full-indexer layer's key row, in one block-major tensor.

Owns the memory and its per-layer views only; never decides which block belongs to whom.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LatentKVCacheSpec:
    """Shape of one worker's latent KV cache. A block holds `block_size` tokens of every layer:
    `num_layers` rows of latent_dim + rope_dim, and a key row of index_dim for each layer in
    `index_layers` (the layers that run their own indexer)."""

    num_layers: int
    latent_dim: int  # kv_lora_rank
    rope_dim: int  # qk_rope_head_dim
    index_layers: tuple[int, ...]
    index_dim: int  # index_head_dim
    block_size: int
    num_blocks: int
    dtype: torch.dtype = torch.float32

    @property
    def row_width(self) -> int:
        """Latent + RoPE elements of one token in one layer."""
        return self.latent_dim + self.rope_dim

    @property
    def elements_per_token(self) -> int:
        return self.num_layers * self.row_width + len(self.index_layers) * self.index_dim

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.block_size * self.elements_per_token * elem

    def allocate(self, device: torch.device | str = "cpu") -> LatentKVCache:
        return LatentKVCache(self, device)


class LatentKVCache:
    """`data` is [num_blocks, block_elements]: block b's bytes are one contiguous region, the
    attention rows [num_layers, block_size, row_width] first, then the indexer key rows
    [len(index_layers), block_size, index_dim]. `rows` and `index_rows` view it per layer.
    """

    transferable = False  # the P/D connector moves [blocks, layers, 2, ...] head caches only

    def __init__(self, spec: LatentKVCacheSpec, device: torch.device | str = "cpu") -> None:
        self.spec = spec
        s = spec
        attn = s.num_layers * s.block_size * s.row_width
        self.data = torch.zeros(
            s.num_blocks, s.block_size * s.elements_per_token, dtype=s.dtype, device=device
        )
        self.rows = self.data[:, :attn].view(s.num_blocks, s.num_layers, s.block_size, -1)
        self.index_rows = self.data[:, attn:].view(
            s.num_blocks, len(s.index_layers), s.block_size, s.index_dim
        )
        self._index_slot = {layer: slot for slot, layer in enumerate(s.index_layers)}

    def has_index_keys(self, layer: int) -> bool:
        return layer in self._index_slot

    def gather(
        self, layer: int, blocks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(latent [N * block_size, latent_dim], RoPE keys [N * block_size, rope_dim], index
        keys [N * block_size, index_dim] or None on a shared-indexer layer) of `blocks`
        (int64 [N]) in one layer: block 0's tokens, then block 1's, ... (copies)."""
        s = self.spec
        rows = self.rows[:, layer].index_select(0, blocks).reshape(-1, s.row_width)
        latent, rope = rows[:, : s.latent_dim], rows[:, s.latent_dim :]
        slot = self._index_slot.get(layer)
        keys = None
        if slot is not None:
            keys = self.index_rows[:, slot].index_select(0, blocks).reshape(-1, s.index_dim)
        return latent, rope, keys

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> None:
        """Store the rows of tokens at flat slots (block * block_size + offset) of `layer`.
        Index keys are kept only on the layers that own them (else ignored)."""
        bs = self.spec.block_size
        blocks, offsets = slots // bs, slots % bs
        row = torch.cat((latent, rope_keys), dim=-1).to(self.spec.dtype)
        self.rows[blocks, layer, offsets] = row
        slot = self._index_slot.get(layer)
        if slot is not None:
            if index_keys is None:
                raise ValueError(f"layer {layer} runs its own indexer: write needs its index keys")
            self.index_rows[blocks, slot, offsets] = index_keys.to(self.spec.dtype)
