"""CPU KV offload: copies evicted cached blocks from the device cache into the host tier and
reloads prefix hits from it, counting both.

Owns the device <-> host copies of whole blocks and their counters; never decides which block is
evicted (the block pool does) or which request reloads (the allocator does).

A block's bytes are `data[b]` of the device cache (all layers, as stored: fp32, bf16 or packed
fp8 with its scales), so a reloaded block is bit-identical to the one evicted. On a CUDA device
the copies go through a pinned slab with non_blocking=True on the step's stream: they are
queued, the host thread goes on scheduling, and the forward that reads a reloaded block is
ordered after its copy by the stream itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loom_runtime.kv.host_pool import HostKVPool, HostPoolStats
from loom_runtime.wire.kv_events import KVEventSink
from loom_runtime.wire.prefix_hash import BlockHash


@dataclass(frozen=True)
class OffloadStats:
    host: HostPoolStats
    offloaded_blocks: int  # evicted device blocks copied to the host tier (counter)
    reload_tokens: int  # prompt tokens served by reloading host blocks (counter)
    reload_bytes: int  # bytes copied back to the device (counter)


class KVOffload:
    """The host tier of one device KV cache (`data`: [num_blocks, ...], block-major)."""

    def __init__(
        self,
        data: torch.Tensor,
        capacity_bytes: int,
        block_size: int,
        events: KVEventSink | None = None,
    ) -> None:
        self._data = data
        self.block_size = block_size
        self.host = HostKVPool(
            capacity_bytes,
            tuple(data.shape[1:]),
            data.dtype,
            block_size,
            events,
            pin_memory=data.device.type == "cuda",
        )
        self._offloaded = 0
        self._reload_blocks = 0

    def offload(self, evicted: Sequence[tuple[int, BlockHash]]) -> None:
        """The block pool is about to reuse these (block id, hash): keep their bytes."""
        self._offloaded += self.host.store([(h, self._data[b]) for b, h in evicted])

    def lookup(self, hashes: Sequence[BlockHash]) -> int:
        """Blocks of `hashes`, from the first, a reload can serve now."""
        return self.host.lookup(hashes)

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        self.host.touch(hashes)

    def reload(self, hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> int:
        """Copy the held blocks `hashes` into device blocks `block_ids`, stopping at the first
        one no longer held; returns how many were reloaded."""
        n = self.host.lookup(hashes)
        for h, b in zip(hashes[:n], block_ids, strict=False):
            self.host.load(h, self._data[b])
        self._reload_blocks += n
        return n

    def clear(self) -> int:
        return self.host.clear()

    def stats(self) -> OffloadStats:
        return OffloadStats(
            host=self.host.stats(),
            offloaded_blocks=self._offloaded,
            reload_tokens=self._reload_blocks * self.block_size,
            reload_bytes=self._reload_blocks * self.host.block_bytes,
        )
