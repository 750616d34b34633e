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


class SparseMlaCache:
    """Per layer: a latent row + a RoPE key row per token; per full indexer layer: a key row.

    Bounded by `capacity` tokens, allocated up front. A forward writes its new tokens' rows
    at `length`, reads rows 0..length+T-1, and then `advance(T)` commits them.
    """

    def __init__(
        self,
        config: SparseMlaConfig,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        layers = config.num_hidden_layers
        self.capacity = capacity
        self.length = 0
        self.latent = torch.zeros(layers, capacity, config.kv_lora_rank, dtype=dtype, device=device)
        self.rope_keys = torch.zeros(
            layers, capacity, config.qk_rope_head_dim, dtype=dtype, device=device
        )
        full = config.full_indexer_layers
        self._index_slot = {layer: slot for slot, layer in enumerate(full)}
        self.index_keys = torch.zeros(
            len(full), capacity, config.index_head_dim, dtype=dtype, device=device
        )

    @property
    def bytes_per_token(self) -> int:
        """Cached bytes one token costs across every layer."""
        rows = (self.latent, self.rope_keys, self.index_keys)
        return sum(t.shape[0] * t.shape[2] * t.element_size() for t in rows)

    def check_room(self, new_tokens: int) -> None:
        if self.length + new_tokens > self.capacity:
            raise ValueError(
                f"sequence cache holds {self.capacity} tokens; {self.length} cached + "
                f"{new_tokens} new do not fit: create the cache with a larger capacity"
            )

    def write(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        """Store the new tokens' rows of `layer`; the rows of the whole context, new ones last."""
        start, end = self.length, self.length + latent.shape[0]
        self.latent[layer, start:end] = latent
        self.rope_keys[layer, start:end] = rope_keys
        slot = self._index_slot.get(layer)
        if slot is not None and index_keys is not None:
            self.index_keys[slot, start:end] = index_keys
        return LayerRows(
            latent=self.latent[layer, :end],
            rope_keys=self.rope_keys[layer, :end],
            index_keys=None if slot is None else self.index_keys[slot, :end],
        )

    def advance(self, new_tokens: int) -> None:
        """Commit the rows of the forward that just wrote `new_tokens` tokens."""
        self.check_room(new_tokens)
        self.length += new_tokens
