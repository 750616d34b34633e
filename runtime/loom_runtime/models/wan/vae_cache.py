"""The frame-chunked causal caches of VAE decode: each causal convolution's last input frames,
for one video (`CausalCache`) or a batch of videos decoded in one call (`BatchedCausalCache`).

Per-decode state, owned by whoever streams the latent frames; never holds weights or computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class ChunkCache(Protocol):
    """What the decoder's layers read and write while they stream one chunk: a history slot per
    causal convolution (and per temporal upsampler), batch rows on dim 0 of every slot."""

    @property
    def first_chunk(self) -> bool:
        """True until a chunk has been decoded through this cache."""
        ...

    def read(self, slot: int) -> torch.Tensor | None: ...

    def write(self, slot: int, frames: torch.Tensor) -> None: ...

    def advance(self) -> None:
        """One more chunk decoded (the decoder calls it after each chunk)."""
        ...


class CausalCache:
    """One history slot per causal convolution (and per temporal upsampler) of a decoder.

    A slot is None until its layer has seen a frame; then it holds the last frames that layer
    needs from the past (zeros before the first frame), so decoding latent frames one chunk
    at a time equals decoding them all at once.
    """

    def __init__(self, slots: int) -> None:
        self.slots: list[torch.Tensor | None] = [None] * slots
        self.chunks = 0  # latent chunks decoded so far

    @property
    def first_chunk(self) -> bool:
        return self.chunks == 0

    def read(self, slot: int) -> torch.Tensor | None:
        return self.slots[slot]

    def write(self, slot: int, frames: torch.Tensor) -> None:
        """Keep a copy of `frames` (never a view, so the chunk's activations can be freed)."""
        self.slots[slot] = frames.clone()

    def advance(self) -> None:
        self.chunks += 1

    def clear(self) -> None:
        """Free every held frame (after the last chunk, or on cancel)."""
        self.slots = [None] * len(self.slots)
        self.chunks = 0

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds now (what a decode keeps resident between chunks)."""
        return sum(t.numel() * t.element_size() for t in self.slots if t is not None)


class BatchedCausalCache:
    """The caches of several one-row videos as one batch: row i of every slot is members[i]'s.

    A read stacks the members' slots (a member's empty conv slot is its zero history, so it
    reads as zeros when another member's slot is full); a write splits the rows back, each
    member keeping its own copy, so a member cleared (cancelled) mid-decode frees its frames
    and the others' never alias it. Members must all be on their first chunk or all past it:
    the decoder branches on that.
    """

    def __init__(self, members: Sequence[CausalCache]) -> None:
        if not members:
            raise ValueError("a BatchedCausalCache needs at least one member cache")
        slots = {len(m.slots) for m in members}
        if len(slots) != 1:
            raise ValueError(f"member caches have different slot counts {sorted(slots)}")
        if len({m.first_chunk for m in members}) != 1:
            raise ValueError(
                "member caches mix first-chunk and later-chunk decodes; batch each group alone"
            )
        self.members = tuple(members)

    @property
    def first_chunk(self) -> bool:
        return self.members[0].first_chunk

    def read(self, slot: int) -> torch.Tensor | None:
        held = [m.read(slot) for m in self.members]
        present = next((t for t in held if t is not None), None)
        if present is None:
            return None
        return torch.cat([torch.zeros_like(present) if t is None else t for t in held])

    def write(self, slot: int, frames: torch.Tensor) -> None:
        if frames.shape[0] != len(self.members):
            raise ValueError(
                f"slot {slot}: {frames.shape[0]} batch rows for {len(self.members)} member "
                "caches (each member is one video of one row)"
            )
        for i, member in enumerate(self.members):
            member.write(slot, frames[i : i + 1])

    def advance(self) -> None:
        for member in self.members:
            member.advance()


class SlotCounter:
    """Hands out consecutive cache slots while a decoder is built."""

    def __init__(self) -> None:
        self.count = 0

    def take(self) -> int:
        self.count += 1
        return self.count - 1
