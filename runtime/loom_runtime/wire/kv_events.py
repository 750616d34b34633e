"""KV cache event records (vLLM's BlockStored / BlockRemoved / AllBlocksCleared) and their sinks.

Owns the records and the bounded in-memory buffer; never does I/O (the publisher does) and never
blocks the engine.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from loom_runtime.wire.errors import WireConfigError
from loom_runtime.wire.prefix_hash import BlockHash

logger = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"
"""vLLM's medium name for the accelerator-resident tier (used whatever the device)."""

MEDIUM_CPU = "CPU"
"""vLLM's medium name for the host-memory tier (its CPU KV offload; Loom's kv/host_pool.py)."""


@dataclass(frozen=True)
class BlockStored:
    """Full blocks entered the prefix cache. Fields and order follow vLLM's struct.

    `token_ids` holds the tokens of all `block_hashes` blocks, in order; `parent_block_hash`
    is the hash of the block before the first one (None at the start of a sequence).
    """

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None  # one entry per block
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks left the prefix cache (evicted for reuse)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = MEDIUM_GPU
    group_idx: int | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every cached block was dropped (a weight sync or an explicit reset)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventSink(Protocol):
    """Where the block pool reports cache changes. `emit` must be cheap and never block."""

    def emit(self, event: KVEvent) -> None: ...


class EventBuffer:
    """A bounded, thread-safe FIFO of events between the engine thread and the publisher.

    When full, the oldest event is dropped and counted (a router then mispredicts a few hits,
    which costs latency, never correctness); the engine is never blocked.
    """

    def __init__(self, max_events: int = 100_000) -> None:
        if max_events <= 0:
            raise WireConfigError(f"max_events must be positive, got {max_events}")
        self._events: deque[KVEvent] = deque(maxlen=max_events)
        self._lock = threading.Lock()
        self._emitted = 0
        self._dropped = 0

    def emit(self, event: KVEvent) -> None:
        with self._lock:
            if len(self._events) == self._events.maxlen:
                self._dropped += 1
                if self._dropped == 1 or self._dropped % 10_000 == 0:
                    logger.warning("kv event buffer full", extra={"dropped": self._dropped})
            self._events.append(event)
            self._emitted += 1

    def take(self) -> list[KVEvent]:
        """Remove and return every pending event, oldest first."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
            return events

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._events)

    @property
    def emitted(self) -> int:
        """Events emitted since creation, dropped ones included (a monotonic mark)."""
        with self._lock:
            return self._emitted

    @property
    def dropped(self) -> int:
        with self._lock:
            return self._dropped
