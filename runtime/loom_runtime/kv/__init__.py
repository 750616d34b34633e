"""Paged KV blocks, vLLM-compatible prefix hashing and KV events.

Owns block accounting; never runs the model.
"""

from loom_runtime.kv.allocator import KVAllocator
from loom_runtime.kv.block_pool import BlockPool
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.kv.errors import BlockStateError, KVConfigError, OutOfBlocksError
from loom_runtime.kv.event_publisher import KVEventPublisher
from loom_runtime.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBuffer,
    KVEvent,
    KVEventSink,
)
from loom_runtime.wire.prefix_hash import BlockHash, PrefixHasher

__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockPool",
    "BlockRemoved",
    "BlockStateError",
    "BlockStored",
    "BlockTable",
    "EventBuffer",
    "KVAllocator",
    "KVConfigError",
    "KVEvent",
    "KVEventPublisher",
    "KVEventSink",
    "OutOfBlocksError",
    "PrefixHasher",
]
