"""PackedCache: one sequence's rows on one rank stored as packed fp8 rows (kv/fp8.py: the
656-byte MLA row and the 132-byte indexer row at GLM-5 dims), the memory an fp8 KV rank holds.

Owns the packed rows (the length and layer slots are SequenceRows'), with SparseMlaCache's
interface (a write returns the whole context decoded); never computes attention or decides
what is selected.
"""

from __future__ import annotations

import torch

from loom_runtime.kv.fp8 import Fp8Format, pack, pack_mla, unpack, unpack_mla
from loom_runtime.models.sparse_mla.cache import LayerRows, SequenceRows
from loom_runtime.models.sparse_mla.config import SparseMlaConfig


class PackedCache(SequenceRows):
    """Per layer a packed latent + RoPE row per token; per full indexer layer a packed key row.
    Rows are decoded to `dtype` when read: a write returns the context as an fp8 paged cache's
    gather does, so a rank's attention reads what one rank's fp8 pool gives back."""

    def __init__(
        self,
        config: SparseMlaConfig,
        capacity: int,
        fp8: Fp8Format,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        layers: range | None = None,
    ) -> None:
        super().__init__(config, capacity, layers)
        self.fp8 = fp8
        self.dtype = dtype
        self._latent_dim, self._rope_dim = config.kv_lora_rank, config.qk_rope_head_dim
        self._index_dim = config.index_head_dim
        width, n = fp8.mla_row_bytes(self._latent_dim, self._rope_dim), self.allocated
        self.rows = torch.zeros(self.num_layers, n, width, dtype=torch.uint8, device=device)
        keys = fp8.row_bytes(self._index_dim)
        self.keys = torch.zeros(self.num_index_layers, n, keys, dtype=torch.uint8, device=device)

    _stored = ("rows", "keys")

    @property
    def device(self) -> torch.device:
        return self.rows.device

    @property
    def bytes_per_token(self) -> int:
        """Stored bytes one token costs across every layer (the planner's fp8 figure)."""
        return self.rows.shape[0] * self.rows.shape[2] + self.keys.shape[0] * self.keys.shape[2]

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's packed latent + RoPE row in one layer (what a tier copy moves)."""
        return int(self.rows.shape[2])

    def store(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> None:
        """Pack the new tokens' rows of `layer` (at `length` on)."""
        start, end = self.length, self.length + latent.shape[0]
        self.reserve(end)
        row = self._row[layer]
        slot = self._index_slot.get(layer)
        if end > start:  # a DCP rank may own none of a step's tokens
            self.rows[row, start:end] = pack_mla(latent, rope_keys, self.fp8)
            if slot is not None and index_keys is not None:
                self.keys[slot, start:end] = pack(index_keys, self.fp8)

    def rows_at(self, layer: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent and RoPE rows of `layer` at `positions` ([n] int64, cached tokens), decoded."""
        return self._decode(self.rows[self._row[layer]].index_select(0, positions))

    def context(self, layer: int, end: int) -> LayerRows:
        """The rows of `layer` for tokens 0..end-1, decoded."""
        row, slot = self._row[layer], self._index_slot.get(layer)
        lat, rope = self._decode(self.rows[row, :end])
        keys = None if slot is None else self._decode_keys(self.keys[slot, :end])
        return LayerRows(latent=lat, rope_keys=rope, index_keys=keys)

    def rows_between(
        self, first: int, last: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows first..last-1 decoded, on the CPU: as SparseMlaCache.rows_between."""
        lat, rope = self._decode(self.rows[:, first:last])
        return lat.cpu(), rope.cpu(), self._decode_keys(self.keys[:, first:last]).cpu()

    def _decode(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lat, rope = unpack_mla(rows, self._latent_dim, self._rope_dim, self.fp8)
        return lat.to(self.dtype), rope.to(self.dtype)

    def _decode_keys(self, rows: torch.Tensor) -> torch.Tensor:
        return unpack(rows, self._index_dim, self.fp8).to(self.dtype)
