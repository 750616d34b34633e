"""One request's KV blocks: which pool blocks hold its tokens and how many are prefix-cached.

Owns per-request block bookkeeping only; mutated solely by `KVAllocator`, owned by one loop state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loom_runtime.kv.offload import ReloadJob
from loom_runtime.wire.prefix_hash import BlockHash


@dataclass
class BlockTable:
    """Token i of the request lives in block `block_ids[i // block_size]`, slot `i % block_size`.

    `hashes[j]` is the chained hash of full block j, for j < `num_committed` (the blocks offered
    to the prefix cache). `cache_salt` and `lora_name` are set by the request's owner before
    admission and enter the hashes as vLLM's extra keys.
    """

    block_ids: list[int] = field(default_factory=list)
    num_committed: int = 0
    hashes: list[BlockHash] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens that were prefix-cache hits at admission
    cache_salt: str | None = None
    lora_name: str | None = None
    reload: ReloadJob | None = None  # host-tier hits still being copied in (async reload)
    replica: int = 0  # DP ranks: the attention replica whose ranks hold these tokens' rows

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    def capacity(self, block_size: int) -> int:
        """Tokens the table can hold without growing."""
        return len(self.block_ids) * block_size

    def slots(self, start: int, end: int, block_size: int) -> list[int]:
        """Flat cache slots (block * block_size + offset) of tokens start..end-1."""
        if not 0 <= start <= end <= self.capacity(block_size):
            raise IndexError(
                f"tokens {start}..{end} outside the table's {self.capacity(block_size)} slots"
            )
        return [
            self.block_ids[i // block_size] * block_size + i % block_size for i in range(start, end)
        ]

    def clear(self) -> None:
        self.block_ids = []
        self.hashes = []
        self.num_committed = 0
        self.num_cached_tokens = 0
        self.reload = None
