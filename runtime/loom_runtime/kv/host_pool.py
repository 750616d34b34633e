"""The host KV tier: a bounded LRU map from block hash to one block's KV bytes in host memory.

Owns the host slab, which hash sits in which slot, LRU order and the tier's KV events (medium
CPU); never decides what to offload or reload (kv/offload.py does) and never grows past its
capacity in bytes.

Events follow vLLM's CPU offload: BlockStored(block_hashes, parent None, no token ids,
block_size, medium "CPU") when blocks enter the tier, BlockRemoved(medium "CPU") when they leave.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loom_runtime.kv.errors import KVConfigError
from loom_runtime.wire.kv_events import MEDIUM_CPU, BlockRemoved, BlockStored, KVEventSink
from loom_runtime.wire.prefix_hash import BlockHash

GIB = 1 << 30


@dataclass(frozen=True)
class HostPoolStats:
    capacity_bytes: int  # the slab: capacity_blocks whole blocks
    used_bytes: int
    num_blocks: int  # blocks held now
    stored_blocks: int  # blocks that entered the tier (counter)
    evicted_blocks: int  # blocks dropped to make room (counter)


class HostKVPool:
    """`capacity_blocks` slots of `block_shape` elements of `dtype` (one device block each).

    Single-threaded: the step thread owns it. The slab is pinned when `pin_memory` (a CUDA
    device), so copies to and from the device can be queued without blocking the host. A block
    `pin`ned for a reload on another thread is never evicted (its slot is not overwritten) until
    it is unpinned; `slot_view` hands that thread the slot's memory.
    """

    def __init__(
        self,
        capacity_bytes: int,
        block_shape: Sequence[int],
        dtype: torch.dtype,
        block_size: int,
        events: KVEventSink | None = None,
        pin_memory: bool = False,
    ) -> None:
        numel = 1
        for n in block_shape:
            numel *= n
        self.block_bytes = numel * dtype.itemsize
        self.capacity_blocks = capacity_bytes // self.block_bytes if self.block_bytes else 0
        if self.capacity_blocks < 1:
            raise KVConfigError(
                f"the host KV tier ({capacity_bytes / GIB:g} GiB) cannot hold one KV block of "
                f"{self.block_bytes} bytes; raise kvOffload.hostGiB (--kv-offload-gib) or set 0"
            )
        self.block_size = block_size
        self._events = events
        self._slab = torch.empty(
            (self.capacity_blocks, *block_shape), dtype=dtype, pin_memory=pin_memory
        )
        self._slots: OrderedDict[BlockHash, int] = OrderedDict()  # first = evicted first
        self._free = list(range(self.capacity_blocks - 1, -1, -1))
        self._pins: dict[BlockHash, int] = {}
        self._stored = 0
        self._evicted = 0

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._slots

    def lookup(self, hashes: Sequence[BlockHash]) -> int:
        """How many of `hashes`, from the first, the tier holds in a row; no LRU change."""
        n = 0
        for h in hashes:
            if h not in self._slots:
                break
            n += 1
        return n

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        """Make these held blocks the most recently used (evicted last)."""
        for h in hashes:
            if h in self._slots:
                self._slots.move_to_end(h)

    def store(self, blocks: Sequence[tuple[BlockHash, torch.Tensor]]) -> int:
        """Copy each (hash, one block's bytes) in, evicting the least recently used blocks for
        room; a hash already held is only touched. Returns how many blocks entered."""
        stored: list[BlockHash] = []
        evicted: list[BlockHash] = []
        for h, data in blocks:
            if h in self._slots:
                self._slots.move_to_end(h)
                continue
            if self._free:
                slot = self._free.pop()
            else:
                old = next((o for o in self._slots if o not in self._pins), None)
                if old is None:  # every block is being reloaded: this one is not kept
                    continue
                slot = self._slots.pop(old)
                evicted.append(old)
            self._slab[slot].copy_(data.reshape(self._slab.shape[1:]), non_blocking=True)
            self._slots[h] = slot
            stored.append(h)
        self._stored += len(stored)
        self._evicted += len(evicted)
        if stored and self._events is not None:
            self._events.emit(
                BlockStored(
                    block_hashes=tuple(stored),
                    parent_block_hash=None,
                    token_ids=(),
                    block_size=self.block_size,
                    medium=MEDIUM_CPU,
                )
            )
        if evicted and self._events is not None:
            self._events.emit(BlockRemoved(tuple(evicted), medium=MEDIUM_CPU))
        return len(stored)

    def pin(self, hashes: Sequence[BlockHash]) -> None:
        """Keep these held blocks (and their slots) until `unpin`; KeyError if one is not held."""
        for h in hashes:
            if h not in self._slots:
                raise KeyError(h)
            self._pins[h] = self._pins.get(h, 0) + 1

    def unpin(self, hashes: Sequence[BlockHash]) -> None:
        for h in hashes:
            left = self._pins[h] - 1
            if left:
                self._pins[h] = left
            else:
                del self._pins[h]

    def slot_view(self, block_hash: BlockHash) -> torch.Tensor:
        """The slab memory of a held block, for a copy on another thread (pin it first)."""
        return self._slab[self._slots[block_hash]]

    def clear(self) -> int:
        """Drop every block (weight sync: the device's AllBlocksCleared covers the router).

        Returns how many were dropped."""
        dropped = len(self._slots)
        self._free.extend(self._slots.values())
        self._slots.clear()
        return dropped

    def stats(self) -> HostPoolStats:
        return HostPoolStats(
            capacity_bytes=self.capacity_blocks * self.block_bytes,
            used_bytes=len(self._slots) * self.block_bytes,
            num_blocks=len(self._slots),
            stored_blocks=self._stored,
            evicted_blocks=self._evicted,
        )
