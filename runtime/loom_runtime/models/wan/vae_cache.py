"""The frame-chunked causal cache of one VAE decode: each causal convolution's last input frames.

Per-decode state, owned by whoever streams the latent frames; never holds weights or computes.
"""

from __future__ import annotations

import torch


class CausalCache:
    """One history slot per causal convolution (and per temporal upsampler) of a decoder.

    A slot is None until its layer has seen a frame; then it holds the last frames that layer
    needs from the past (zeros before the first frame), so decoding latent frames one chunk
    at a time equals decoding them all at once.
    """

    def __init__(self, slots: int) -> None:
        self.slots: list[torch.Tensor | None] = [None] * slots
        self.chunks = 0  # latent chunks decoded so far

    def read(self, slot: int) -> torch.Tensor | None:
        return self.slots[slot]

    def write(self, slot: int, frames: torch.Tensor) -> None:
        self.slots[slot] = frames

    def clear(self) -> None:
        """Free every held frame (after the last chunk, or on cancel)."""
        self.slots = [None] * len(self.slots)
        self.chunks = 0

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds now (what a decode keeps resident between chunks)."""
        return sum(t.numel() * t.element_size() for t in self.slots if t is not None)


class SlotCounter:
    """Hands out consecutive cache slots while a decoder is built."""

    def __init__(self) -> None:
        self.count = 0

    def take(self) -> int:
        self.count += 1
        return self.count - 1
