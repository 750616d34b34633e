"""SparseMlaCache: one sequence's contiguous cache of latent KV, RoPE keys and indexer keys.

Owns the rows and the sequence length; never computes attention or decides what is selected.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from loom_runtime.models.sparse_mla.config import SparseMlaConfig


@dataclass(frozen=True)
class LayerRows:
    """One layer's cached rows for tokens 0..length-1 (views into the cache)."""

    latent: torch.Tensor  # [L, kv_lora_rank], after kv_a_layernorm
    rope_keys: torch.Tensor  # [L, qk_rope_head_dim], rotated
    index_keys: torch.Tensor | None  # [L, index_head_dim]; None on shared-indexer layers

    def indexer_keys(self) -> torch.Tensor:
        """The index keys a full indexer layer scores; ValueError on rows that have none."""
        if self.index_keys is None:
            raise ValueError("a full indexer layer needs its index keys")
        return self.index_keys


GROW_ROWS = 64  # a cache's rows are allocated in whole runs of this many


def grown_rows(allocated: int, needed: int, capacity: int) -> int:
    """Rows to allocate for `needed` (<= capacity) when `allocated` are: the same if they
    suffice, else at least a quarter more, in whole GROW_ROWS, never past `capacity`."""
    if needed <= allocated:
        return allocated
    want = max(needed, allocated + allocated // 4)
    return min(capacity, -(-want // GROW_ROWS) * GROW_ROWS)


def grown(rows: torch.Tensor, allocate: int, keep: int) -> torch.Tensor:
    """`rows` ([n, rows, width]) reallocated to `allocate` rows, the first `keep` copied."""
    out = rows.new_zeros(rows.shape[0], allocate, rows.shape[2])
    out[:, :keep] = rows[:, :keep]
    return out


class SequenceRows(ABC):
    """What every one-sequence cache shares: its capacity and length, and where each of its
    `layers` (the trunk's by default; MTP layers are numbered after them and each runs its own
    indexer) keeps its rows (`_row`) and index keys (`_index_slot`). Subclasses store them in
    the [layers, rows, width] tensors named by `_stored`, allocated as the sequence grows
    (`reserve`): memory follows the tokens held, not the capacity."""

    _stored: tuple[str, ...] = ()

    def __init__(self, config: SparseMlaConfig, capacity: int, layers: range | None) -> None:
        layers = range(config.num_hidden_layers) if layers is None else layers
        self.capacity = capacity
        self.allocated = min(capacity, GROW_ROWS)
        self.length = 0
        self.num_layers = len(layers)
        self._row = {layer: row for row, layer in enumerate(layers)}
        trunk = set(config.full_indexer_layers)
        full = [layer for layer in layers if layer in trunk or layer >= config.num_hidden_layers]
        self._index_slot = {layer: slot for slot, layer in enumerate(full)}

    @property
    def num_index_layers(self) -> int:
        return len(self._index_slot)

    def has_index(self, layer: int) -> bool:
        """Whether `layer` keeps index keys here (a full indexer layer)."""
        return layer in self._index_slot

    def index_slot(self, layer: int) -> int | None:
        """Which of the index-key layers `layer`'s keys are (None: a shared-indexer layer)."""
        return self._index_slot.get(layer)

    def check_room(self, new_tokens: int) -> None:
        if self.length + new_tokens > self.capacity:
            raise ValueError(
                f"sequence cache holds {self.capacity} tokens; {self.length} cached + "
                f"{new_tokens} new do not fit: create the cache with a larger capacity"
            )

    @abstractmethod
    def store(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> None:
        """Store the new tokens' rows of `layer` (at `length` on)."""

    @abstractmethod
    def context(self, layer: int, end: int) -> LayerRows:
        """The rows of `layer` for tokens 0..end-1, as a forward attends over them."""

    def write(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        """Store the new tokens' rows of `layer`; the rows of the whole context, new ones last."""
        self.store(layer, latent, rope_keys, index_keys)
        return self.context(layer, self.length + int(latent.shape[0]))

    def reserve(self, end: int) -> None:
        """Rows allocated for tokens 0..end-1 (end <= capacity), the cached ones kept."""
        rows = grown_rows(self.allocated, end, self.capacity)
        if rows == self.allocated:
            return
        for name in self._stored:
            setattr(self, name, grown(getattr(self, name), rows, self.length))
        self.allocated = rows

    def advance(self, new_tokens: int) -> None:
        """Commit the rows of the forward that just wrote `new_tokens` tokens."""
        self.check_room(new_tokens)
        self.length += new_tokens

    def truncate(self, length: int) -> None:
        """Forget every row from token `length` on (rejected speculative tokens); the rows stay
        allocated and the next forward overwrites them."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a {self.length}-token cache to {length} tokens")
        self.length = length


class SparseMlaCache(SequenceRows):
    """Per layer: a latent row + a RoPE key row per token; per full indexer layer: a key row.

    Bounded by `capacity` tokens, allocated as they come. A forward writes its new tokens' rows
    at `length`, reads rows 0..length+T-1, and then `advance(T)` commits them; `truncate`
    drops rows a speculative step wrote for tokens that were rejected.

    `layers` are the layer numbers it holds: the trunk's by default, or the MTP layers' (numbered
    after the trunk's; each runs its own indexer).
    """

    def __init__(
        self,
        config: SparseMlaConfig,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        layers: range | None = None,
    ) -> None:
        super().__init__(config, capacity, layers)
        n, rows = self.num_layers, self.allocated
        self.latent = torch.zeros(n, rows, config.kv_lora_rank, dtype=dtype, device=device)
        self.rope_keys = torch.zeros(n, rows, config.qk_rope_head_dim, dtype=dtype, device=device)
        self.index_keys = torch.zeros(
            self.num_index_layers, rows, config.index_head_dim, dtype=dtype, device=device
        )

    _stored = ("latent", "rope_keys", "index_keys")

    @property
    def device(self) -> torch.device:
        return self.latent.device

    def rows_between(
        self, first: int, last: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copies of rows first..last-1 on the CPU: latent [layers, n, kv_lora_rank], RoPE keys
        [layers, n, rope], index keys [full indexer layers, n, index_head_dim]."""
        return tuple(  # type: ignore[return-value]
            t[:, first:last].cpu().clone() for t in (self.latent, self.rope_keys, self.index_keys)
        )

    @property
    def bytes_per_token(self) -> int:
        """Cached bytes one token costs across every layer."""
        rows = (self.latent, self.rope_keys, self.index_keys)
        return sum(t.shape[0] * t.shape[2] * t.element_size() for t in rows)

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's latent + RoPE row in one layer (what a tier copy moves)."""
        return (self.latent.shape[2] + self.rope_keys.shape[2]) * self.latent.element_size()

    def store(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> None:
        """Store the new tokens' rows of `layer` (at `length` on)."""
        start, end = self.length, self.length + latent.shape[0]
        self.reserve(end)
        row = self._row[layer]
        self.latent[row, start:end] = latent
        self.rope_keys[row, start:end] = rope_keys
        slot = self._index_slot.get(layer)
        if slot is not None and index_keys is not None:
            self.index_keys[slot, start:end] = index_keys

    def rows_at(self, layer: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent and RoPE rows of `layer` at `positions` ([n] int64, cached tokens)."""
        row = self._row[layer]
        return self.latent[row].index_select(0, positions), self.rope_keys[row].index_select(
            0, positions
        )

    def context(self, layer: int, end: int) -> LayerRows:
        """Views of the rows of `layer` for tokens 0..end-1."""
        row, slot = self._row[layer], self._index_slot.get(layer)
        return LayerRows(
            latent=self.latent[row, :end],
            rope_keys=self.rope_keys[row, :end],
            index_keys=None if slot is None else self.index_keys[slot, :end],
        )
