"""SparseMlaCache: one sequence's contiguous cache of latent KV, RoPE keys and indexer keys.

Owns the rows and the sequence length; never computes attention or decides what is selected.
"""

from __future__ import annotations

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


class SequenceRows:
    """What every one-sequence cache shares: its capacity and length, and where each of its
    `layers` (the trunk's by default; MTP layers are numbered after them and each runs its own
    indexer) keeps its rows (`_row`) and index keys (`_index_slot`). Subclasses store them."""

    def __init__(self, config: SparseMlaConfig, capacity: int, layers: range | None) -> None:
        layers = range(config.num_hidden_layers) if layers is None else layers
        self.capacity = capacity
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

    def check_room(self, new_tokens: int) -> None:
        if self.length + new_tokens > self.capacity:
            raise ValueError(
                f"sequence cache holds {self.capacity} tokens; {self.length} cached + "
                f"{new_tokens} new do not fit: create the cache with a larger capacity"
            )

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

    Bounded by `capacity` tokens, allocated up front. A forward writes its new tokens' rows
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
        n = self.num_layers
        self.latent = torch.zeros(n, capacity, config.kv_lora_rank, dtype=dtype, device=device)
        self.rope_keys = torch.zeros(
            n, capacity, config.qk_rope_head_dim, dtype=dtype, device=device
        )
        self.index_keys = torch.zeros(
            self.num_index_layers, capacity, config.index_head_dim, dtype=dtype, device=device
        )

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

    def write(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        """Store the new tokens' rows of `layer`; the rows of the whole context, new ones last."""
        start, end = self.length, self.length + latent.shape[0]
        row = self._row[layer]
        self.latent[row, start:end] = latent
        self.rope_keys[row, start:end] = rope_keys
        slot = self._index_slot.get(layer)
        if slot is not None and index_keys is not None:
            self.index_keys[slot, start:end] = index_keys
        return LayerRows(
            latent=self.latent[row, :end],
            rope_keys=self.rope_keys[row, :end],
            index_keys=None if slot is None else self.index_keys[slot, :end],
        )
