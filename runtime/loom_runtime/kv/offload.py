"""CPU KV offload: copies evicted cached blocks from the device cache into the host tier and
reloads prefix hits from it, counting both.

Owns the device <-> host copies of whole blocks and their counters; never decides which block is
evicted (the block pool does) or which request reloads (the allocator does).

A block's bytes are `data[b]` of the device cache (all layers, as stored: fp32, bf16 or packed
fp8 with its scales), so a reloaded block is bit-identical to the one evicted. Offload copies
run on the step thread (on a CUDA device: non_blocking from the step's stream into a pinned
slab, ordered before any later write of the block by the stream). A reload is three calls:
`begin_reload` on the step thread (pins the host blocks, resolves the copies), `copy` on any
thread (on CUDA: on a side stream that first waits for the step's stream, then synchronises,
so the forward that reads the blocks comes after), `end_reload` on the step thread.

The cache whose blocks are offloaded need not be on the device: under Hybrid HiSparse it is the
host tier (a whole latent cache, rows and indexer keys; page-locked on a CUDA device), whose
blocks are the pool's. `data` on the CPU means plain host-to-host copies on the calling thread
(every write into that tier has finished by then: its device-to-host copies are synchronous),
an unpinned slab (nothing crosses PCIe from it) and no CUDA stream or event; `on_reloaded`
then refreshes what the device keeps of the reloaded blocks (HiSparse: their indexer keys).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from loom_runtime.kv.host_pool import HostKVPool, HostPoolStats
from loom_runtime.wire.kv_events import KVEventSink
from loom_runtime.wire.prefix_hash import BlockHash


@dataclass(frozen=True)
class ReloadJob:
    """Copies of one admission's host hits into its new device blocks (see `KVOffload`)."""

    hashes: tuple[BlockHash, ...]
    block_ids: tuple[int, ...]
    copies: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # (cache block, host slot)
    ready: torch.cuda.Event | None = None  # CUDA: the step stream's work before the job

    @property
    def num_blocks(self) -> int:
        return len(self.hashes)


@dataclass(frozen=True)
class OffloadStats:
    host: HostPoolStats
    offloaded_blocks: int  # evicted device blocks copied to the host tier (counter)
    reload_tokens: int  # prompt tokens served by reloading host blocks (counter)
    reload_bytes: int  # bytes copied back to the device (counter)


class KVOffload:
    """The offload tier of one KV cache (`data`: [num_blocks, ...], block-major; the device
    cache, or under HiSparse its host tier). `on_reloaded(block_ids)` is called on the step
    thread when a reload's bytes are in `data` (HiSparse: copy their keys to the device)."""

    def __init__(
        self,
        data: torch.Tensor,
        capacity_bytes: int,
        block_size: int,
        events: KVEventSink | None = None,
        on_reloaded: Callable[[list[int]], None] | None = None,
    ) -> None:
        self._data = data
        self._on_reloaded = on_reloaded
        self.block_size = block_size
        self.host = HostKVPool(
            capacity_bytes,
            tuple(data.shape[1:]),
            data.dtype,
            block_size,
            events,
            pin_memory=data.device.type == "cuda",  # a host `data` copies host to host
        )
        self._offloaded = 0
        self._reload_blocks = 0
        self._stream: torch.cuda.Stream | None = None  # CUDA: the reload copies' side stream

    def offload(self, evicted: Sequence[tuple[int, BlockHash]]) -> None:
        """The block pool is about to reuse these (block id, hash): keep their bytes."""
        self._offloaded += self.host.store([(h, self._data[b]) for b, h in evicted])

    def lookup(self, hashes: Sequence[BlockHash]) -> int:
        """Blocks of `hashes`, from the first, a reload can serve now."""
        return self.host.lookup(hashes)

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        self.host.touch(hashes)

    def begin_reload(self, hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> ReloadJob:
        """Step thread: the job copying the held run of `hashes` (from the first, stopping at one
        no longer held) into device blocks `block_ids`; its host blocks stay until `end_reload`."""
        n = self.host.lookup(hashes)
        held = tuple(hashes[:n])
        self.host.pin(held)
        self.host.touch(held)
        ids = tuple(block_ids[:n])
        copies = tuple(
            (self._data[b], self.host.slot_view(h)) for h, b in zip(held, ids, strict=True)
        )
        ready = None
        if self._data.device.type == "cuda" and n:
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record()
        return ReloadJob(held, ids, copies, ready)

    def copy(self, job: ReloadJob) -> None:
        """Any thread: do the job's copies; on return the device blocks hold the bytes."""
        if job.ready is None:
            for dst, src in job.copies:
                dst.copy_(src.view(dst.shape))
            return
        if self._stream is None:  # made by the first copying thread, then reused
            self._stream = torch.cuda.Stream(device=self._data.device)  # type: ignore[no-untyped-call]
        stream = self._stream
        with torch.cuda.stream(stream):
            stream.wait_event(job.ready)
            for dst, src in job.copies:
                dst.copy_(src.view(dst.shape), non_blocking=True)
        stream.synchronize()

    def end_reload(self, job: ReloadJob, copied: bool = True) -> int:
        """Step thread, after `copy` (`copied`: it succeeded): release the host blocks, count
        them and hand their ids to `on_reloaded`; returns the blocks reloaded."""
        self.host.unpin(job.hashes)
        n = job.num_blocks if copied else 0
        self._reload_blocks += n
        if n and self._on_reloaded is not None:
            self._on_reloaded(list(job.block_ids))
        return n

    def reload(self, hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> int:
        """All three steps on this thread; returns how many blocks were reloaded."""
        job = self.begin_reload(hashes, block_ids)
        self.copy(job)
        return self.end_reload(job)

    def clear(self) -> int:
        return self.host.clear()

    def stats(self) -> OffloadStats:
        return OffloadStats(
            host=self.host.stats(),
            offloaded_blocks=self._offloaded,
            reload_tokens=self._reload_blocks * self.block_size,
            reload_bytes=self._reload_blocks * self.host.block_bytes,
        )
