"""The paged latent KV cache of the sparse-MLA family: per token, every layer's latent + RoPE
row and every full-indexer layer's key row, in one block-major tensor (plain, or packed fp8 rows).

Owns the memory and its per-layer views only; never decides which block belongs to whom.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loom_runtime.kv.fp8 import Fp8Format, pack, pack_mla, unpack, unpack_mla


@dataclass(frozen=True)
class LatentKVCacheSpec:
    """Shape of one worker's latent KV cache. A block holds `block_size` tokens of every layer:
    `num_layers` rows of latent_dim + rope_dim, and a key row of index_dim for each layer in
    `index_layers` (the layers that run their own indexer). With `fp8`, each row is stored
    packed (kv/fp8.py: a 656-byte latent row, a 132-byte indexer row at the GLM-5 dims) and
    `dtype` is only the dtype rows are gathered in."""

    num_layers: int
    latent_dim: int  # kv_lora_rank
    rope_dim: int  # qk_rope_head_dim
    index_layers: tuple[int, ...]
    index_dim: int  # index_head_dim
    block_size: int
    num_blocks: int
    dtype: torch.dtype = torch.float32
    fp8: Fp8Format | None = None  # None: rows stored in `dtype`

    @property
    def row_width(self) -> int:
        """Latent + RoPE elements of one token in one layer."""
        return self.latent_dim + self.rope_dim

    @property
    def storage_dtype(self) -> torch.dtype:
        return self.dtype if self.fp8 is None else torch.uint8

    @property
    def stored_row_width(self) -> int:
        """Stored elements (bytes when fp8) of one token's latent + RoPE row in one layer."""
        if self.fp8 is None:
            return self.row_width
        return self.fp8.mla_row_bytes(self.latent_dim, self.rope_dim)

    @property
    def stored_index_width(self) -> int:
        """Stored elements (bytes when fp8) of one token's indexer key row in one layer."""
        return self.index_dim if self.fp8 is None else self.fp8.row_bytes(self.index_dim)

    @property
    def elements_per_token(self) -> int:
        """Stored elements (bytes when fp8) of one token, every layer."""
        index = len(self.index_layers) * self.stored_index_width
        return self.num_layers * self.stored_row_width + index

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.elements_per_token * self.storage_dtype.itemsize

    def allocate(self, device: torch.device | str = "cpu") -> LatentKVCache:
        return LatentKVCache(self, device)


class LatentKVCache:
    """`data` is [num_blocks, block_elements]: block b's bytes are one contiguous region, the
    attention rows [num_layers, block_size, row_width] first, then the indexer key rows
    [len(index_layers), block_size, index_dim]. `rows` and `index_rows` view it per layer.
    With fp8 `data` is uint8 and every row is packed (quantised on write, dequantised on gather).
    """

    transferable = True  # the P/D connector's LatentLayout (transfer/layout.py)

    def __init__(
        self, spec: LatentKVCacheSpec, device: torch.device | str = "cpu", pin_memory: bool = False
    ) -> None:
        """`pin_memory`: page-locked host memory (a host tier feeding a CUDA device)."""
        self.spec = spec
        s = spec
        attn = s.num_layers * s.block_size * s.stored_row_width
        self.data = torch.zeros(
            s.num_blocks,
            s.block_size * s.elements_per_token,
            dtype=s.storage_dtype,
            device=device,
            pin_memory=pin_memory,
        )
        self.rows = self.data[:, :attn].view(s.num_blocks, s.num_layers, s.block_size, -1)
        self.index_rows = self.data[:, attn:].view(
            s.num_blocks, len(s.index_layers), s.block_size, s.stored_index_width
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
        rows = self.rows[:, layer].index_select(0, blocks).reshape(-1, s.stored_row_width)
        latent, rope = self.decode_rows(rows)
        slot = self._index_slot.get(layer)
        keys = None
        if slot is not None:
            stored = self.index_rows[:, slot].index_select(0, blocks)
            keys = stored.reshape(-1, s.stored_index_width)
            if s.fp8 is not None:
                keys = unpack(keys, s.index_dim, s.fp8).to(s.dtype)
        return latent, rope, keys

    def stored_rows(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """The latent + RoPE rows of tokens at flat slots (int64 [N]) of `layer` exactly as
        stored ([N, stored_row_width]: packed bytes when fp8), a copy: what a tier moves."""
        bs = self.spec.block_size
        return self.rows[slots // bs, layer, slots % bs]

    def decode_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(latent [N, latent_dim], RoPE [N, rope_dim]) in `dtype` of stored rows [N, width]
        (on any device: a tier decodes rows where they arrived)."""
        s = self.spec
        if s.fp8 is None:
            return rows[:, : s.latent_dim], rows[:, s.latent_dim :]
        latent, rope = unpack_mla(rows, s.latent_dim, s.rope_dim, s.fp8)
        return latent.to(s.dtype), rope.to(s.dtype)

    def read(
        self, layer: int, slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(latent, RoPE keys, index keys or None) of tokens at flat slots (int64 [N]) of
        `layer`, in `dtype` (copies): what `write` stored there, as a gather returns it."""
        s = self.spec
        latent, rope = self.decode_rows(self.stored_rows(layer, slots))
        slot = self._index_slot.get(layer)
        if slot is None:
            return latent, rope, None
        keys = self.index_rows[slots // s.block_size, slot, slots % s.block_size]
        if s.fp8 is not None:
            keys = unpack(keys, s.index_dim, s.fp8)
        return latent, rope, keys.to(s.dtype)

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
        s = self.spec
        blocks, offsets = slots // s.block_size, slots % s.block_size
        if s.fp8 is None:
            row = torch.cat((latent, rope_keys), dim=-1).to(s.dtype)
        else:
            row = pack_mla(latent, rope_keys, s.fp8)
        self.rows[blocks, layer, offsets] = row
        slot = self._index_slot.get(layer)
        if slot is not None:
            if index_keys is None:
                raise ValueError(f"layer {layer} runs its own indexer: write needs its index keys")
            keys = index_keys.to(s.dtype) if s.fp8 is None else pack(index_keys, s.fp8)
            self.index_rows[blocks, slot, offsets] = keys
