"""The text-encoder feature cache: encoded prompt rows by key, bounded LRU, thread-safe.

Owns cached features and their keys (every field that changes an encoder output); never encodes.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TextFeatureKey:
    """What one encoded row depends on: the model, the token ids (hashed), the encoder's weights
    version, the compute precision and the padded text length."""

    model: str
    token_hash: str
    encoder_version: str
    dtype: str
    text_len: int


def token_hash(ids: Sequence[int]) -> str:
    """SHA-256 of the ids as little-endian int64s (the length is part of the bytes)."""
    return hashlib.sha256(torch.tensor(list(ids), dtype=torch.int64).numpy().tobytes()).hexdigest()


class TextFeatureCache:
    """Up to `capacity` rows; the least recently used goes first. A sync of the encoder
    (`set_encoder_version`) drops every row; nothing else does (a DiT or VAE sync keeps them)."""

    def __init__(
        self, capacity: int, model: str, dtype: torch.dtype, text_len: int, encoder_version: str
    ) -> None:
        if capacity < 0:
            raise ValueError(f"text feature cache capacity must be >= 0, got {capacity}")
        self.capacity, self.model, self.text_len = capacity, model, text_len
        self.dtype = str(dtype).removeprefix("torch.")
        self._version = encoder_version
        self._rows: OrderedDict[TextFeatureKey, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def encoder_version(self) -> str:
        return self._version

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def key(self, ids: Sequence[int]) -> TextFeatureKey:
        return TextFeatureKey(self.model, token_hash(ids), self._version, self.dtype, self.text_len)

    def lookup(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, ...] | None:
        """Features of every row, or None unless all are cached (counted per row)."""
        with self._lock:
            found = [self._rows.get(self.key(r)) for r in rows]
            self.hits += sum(f is not None for f in found)
            self.misses += sum(f is None for f in found)
            if any(f is None for f in found):
                return None
            for r in rows:
                self._rows.move_to_end(self.key(r))
            return tuple(f for f in found if f is not None)

    def store(self, rows: Sequence[Sequence[int]], features: Sequence[torch.Tensor]) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            for ids, feature in zip(rows, features, strict=True):
                self._rows[self.key(ids)] = feature.detach().clone()
                self._rows.move_to_end(self.key(ids))
            while len(self._rows) > self.capacity:
                self._rows.popitem(last=False)

    def set_encoder_version(self, version: str) -> int:
        """The encoder's weights changed: drop every row; returns how many were dropped."""
        with self._lock:
            dropped = len(self._rows)
            self._rows.clear()
            self._version = version
            return dropped
