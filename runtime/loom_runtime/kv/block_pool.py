"""Paged KV block accounting: reference counts, the prefix cache index and LRU eviction.

Owns which block is free, cached or in use; never touches KV memory and never hashes tokens.

Every block id is in exactly one state:
- FREE: ref 0, no hash, in the free list;
- EVICTABLE: ref 0, cached (has a hash), in the LRU (least recently released first);
- USED: ref > 0, cached or not.
No block is reserved: ids 0..num_blocks-1 are all allocatable (there is no null block).
`allocate` takes FREE blocks first and only then evicts EVICTABLE ones, oldest first; with an
`on_evict` hook (CPU KV offload) the evicted (block id, hash) pairs are handed to it first,
while their bytes are still intact.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from loom_runtime.kv.errors import BlockStateError, KVConfigError, OutOfBlocksError
from loom_runtime.wire.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventSink,
)
from loom_runtime.wire.prefix_hash import BlockHash

KV_CACHE_SPEC_KIND = "full_attention"  # what vLLM reports for a single full-attention group

OnEvict = Callable[[Sequence[tuple[int, BlockHash]]], None]


class BlockPool:
    """Block states of one worker's paged KV cache. Single-threaded: the step thread owns it."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        events: KVEventSink | None = None,
        medium: str = MEDIUM_GPU,
        on_evict: OnEvict | None = None,
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise KVConfigError(
                f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._events = events
        self._medium = medium
        self.on_evict = on_evict
        self._ref = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._lru: OrderedDict[int, None] = OrderedDict()  # EVICTABLE, first = evicted first
        self._cached: dict[BlockHash, int] = {}

    # --- sizes ------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks `allocate` can hand out now: FREE plus EVICTABLE."""
        return len(self._free) + len(self._lru)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (vllm:kv_cache_usage_perc)."""
        return self.num_used / self.num_blocks

    @property
    def num_cached(self) -> int:
        """Blocks registered in the prefix cache, in use or evictable."""
        return len(self._cached)

    def ref_count(self, block_id: int) -> int:
        return self._ref[self._check_id(block_id)]

    def block_hash(self, block_id: int) -> BlockHash | None:
        return self._hash[self._check_id(block_id)]

    def evictable(self) -> list[int]:
        """EVICTABLE block ids in eviction order (next victim first)."""
        return list(self._lru)

    # --- allocation and reference counts ------------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """Hand out `n` blocks with ref 1, evicting LRU cached blocks if needed.

        Raises OutOfBlocksError (changing nothing) when fewer than `n` can be freed.
        """
        if n < 0:
            raise BlockStateError(f"cannot allocate a negative number of blocks ({n})")
        if n > self.num_free:
            raise OutOfBlocksError(n, self.num_free)
        out: list[int] = []
        evicted: list[tuple[int, BlockHash]] = []
        while len(out) < n:
            if self._free:
                block_id = self._free.popleft()
            else:
                block_id, _ = self._lru.popitem(last=False)
                evicted.append((block_id, self._uncache(block_id)))
            self._ref[block_id] = 1
            out.append(block_id)
        if evicted:
            if self.on_evict is not None:
                self.on_evict(evicted)
            hashes = tuple(h for _, h in evicted)
            self._emit(BlockRemoved(hashes, medium=self._medium, group_idx=0))
        return out

    def acquire(self, block_ids: Iterable[int]) -> None:
        """One more reference to each block (a prefix hit); an EVICTABLE block leaves the LRU.

        A FREE block cannot be acquired (it holds nothing): BlockStateError, nothing changed.
        """
        ids = [self._check_id(b) for b in block_ids]
        for b in ids:
            if self._ref[b] == 0 and self._hash[b] is None:
                raise BlockStateError(f"block {b} is free; allocate it instead of acquiring it")
        for b in ids:
            if self._ref[b] == 0:
                del self._lru[b]
            self._ref[b] += 1

    def release(self, block_ids: Iterable[int]) -> None:
        """One reference less to each block, in the order given.

        A block reaching ref 0 becomes EVICTABLE at the most-recent end if cached, else FREE.
        Release a sequence's blocks tail-first so its tail is evicted before its head.
        """
        ids = [self._check_id(b) for b in block_ids]
        for b, times in Counter(ids).items():
            if self._ref[b] < times:
                raise BlockStateError(
                    f"block {b} released {times} time(s) but holds {self._ref[b]} reference(s)"
                )
        for b in ids:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if self._hash[b] is None:
                    self._free.append(b)
                else:
                    self._lru[b] = None

    # --- prefix cache -------------------------------------------------------------------------

    def lookup(self, hashes: Sequence[BlockHash]) -> list[int]:
        """Block ids of the longest run of cached blocks from the first hash; no ref change."""
        out: list[int] = []
        for h in hashes:
            block_id = self._cached.get(h)
            if block_id is None:
                break
            out.append(block_id)
        return out

    def commit(
        self,
        block_id: int,
        block_hash: BlockHash,
        parent_hash: BlockHash | None,
        token_ids: Sequence[int],
    ) -> bool:
        """Register one full, in-use block in the prefix cache; see `commit_blocks`."""
        return self.commit_blocks([block_id], [block_hash], parent_hash, token_ids)[0]

    def commit_blocks(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[BlockHash],
        parent_hash: BlockHash | None,
        token_ids: Sequence[int],
        extra_keys: Sequence[tuple[Any, ...] | None] | None = None,
    ) -> list[bool]:
        """Register consecutive full, in-use blocks of one sequence; emits BlockStored.

        `parent_hash` is the hash of the block before `block_ids[0]`; `token_ids` are the
        tokens of all the blocks. When a hash is already cached by another block, that block
        stays the cached one and this block stays uncached (it returns to the free list when
        released; no event for it). Returns, per block, whether it was registered.
        """
        self._check_commit(block_ids, hashes, token_ids, extra_keys)
        registered: list[bool] = []
        run: list[int] = []  # positions of the run of newly registered blocks being built
        for i, (b, h) in enumerate(zip(block_ids, hashes, strict=True)):
            fresh = h not in self._cached
            if fresh:
                self._hash[b] = h
                self._cached[h] = b
                run.append(i)
            else:
                self._flush_stored(run, parent_hash, hashes, token_ids, extra_keys)
                run = []
            registered.append(fresh)
        self._flush_stored(run, parent_hash, hashes, token_ids, extra_keys)
        return registered

    def clear_cache(self) -> int:
        """Drop every hash (weight sync): EVICTABLE blocks become FREE, USED ones uncached.

        Emits AllBlocksCleared. Returns how many blocks were uncached.
        """
        dropped = len(self._cached)
        for b in self._cached.values():
            self._hash[b] = None
        self._cached.clear()
        self._free.extend(self._lru)
        self._lru.clear()
        self._emit(AllBlocksCleared())
        return dropped

    # --- invariants ---------------------------------------------------------------------------

    def check(self) -> None:
        """Raise BlockStateError unless every block is in exactly one consistent state."""
        free, lru = set(self._free), set(self._lru)
        problems: list[str] = []
        if len(free) != len(self._free):
            problems.append("a block is twice in the free list")
        for b in range(self.num_blocks):
            ref, h = self._ref[b], self._hash[b]
            states = [b in free, b in lru, ref > 0]
            if ref < 0 or sum(states) != 1:
                problems.append(f"block {b}: ref={ref} free={states[0]} lru={states[1]}")
            elif b in free and h is not None:
                problems.append(f"block {b} is free but cached")
            elif b in lru and h is None:
                problems.append(f"block {b} is evictable but uncached")
            if h is not None and self._cached.get(h) != b:
                problems.append(f"block {b} has a hash the index does not map to it")
        if len(self._cached) != sum(h is not None for h in self._hash):
            problems.append("the prefix index holds hashes no block has")
        if problems:
            raise BlockStateError("block pool inconsistent: " + "; ".join(problems[:10]))

    def leaked(self) -> list[int]:
        """Block ids still referenced (USED)."""
        return [b for b in range(self.num_blocks) if self._ref[b] > 0]

    def is_whole(self) -> bool:
        """True when consistent and no block is in use: every block FREE or EVICTABLE."""
        self.check()
        return self.num_free == self.num_blocks

    def assert_whole(self) -> None:
        """Raise BlockStateError naming the leaked blocks unless the pool is whole."""
        if not self.is_whole():
            raise BlockStateError(f"blocks still referenced (leak): {self.leaked()[:20]}")

    # --- internals ----------------------------------------------------------------------------

    def _check_id(self, block_id: int) -> int:
        if not 0 <= block_id < self.num_blocks:
            raise BlockStateError(f"block id {block_id} outside 0..{self.num_blocks - 1}")
        return block_id

    def _check_commit(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        extra_keys: Sequence[tuple[Any, ...] | None] | None,
    ) -> None:
        n = len(block_ids)
        if len(hashes) != n or len(token_ids) != n * self.block_size:
            raise BlockStateError(
                f"commit of {n} block(s) needs {n} hashes and {n * self.block_size} tokens, "
                f"got {len(hashes)} and {len(token_ids)}"
            )
        if extra_keys is not None and len(extra_keys) != n:
            raise BlockStateError(f"extra_keys needs one entry per block ({n})")
        if len(set(block_ids)) != n:
            raise BlockStateError(f"a block appears twice in one commit: {list(block_ids)}")
        for b in block_ids:
            if self._ref[self._check_id(b)] == 0:
                raise BlockStateError(f"block {b} is not in use; only held blocks are committed")
            if self._hash[b] is not None:
                raise BlockStateError(f"block {b} is already cached; commit each block once")

    def _flush_stored(
        self,
        run: list[int],
        parent: BlockHash | None,
        hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        extra_keys: Sequence[tuple[Any, ...] | None] | None,
    ) -> None:
        if not run:
            return
        bs, first, last = self.block_size, run[0], run[-1]
        self._emit(
            BlockStored(
                block_hashes=tuple(hashes[first : last + 1]),
                parent_block_hash=parent if first == 0 else hashes[first - 1],
                token_ids=tuple(int(t) for t in token_ids[first * bs : (last + 1) * bs]),
                block_size=bs,
                medium=self._medium,
                extra_keys=tuple(extra_keys[first : last + 1])
                if extra_keys
                else (None,) * len(run),
                group_idx=0,
                kv_cache_spec_kind=KV_CACHE_SPEC_KIND,
            )
        )

    def _uncache(self, block_id: int) -> BlockHash:
        h = self._hash[block_id]
        assert h is not None
        del self._cached[h]
        self._hash[block_id] = None
        return h

    def _emit(self, event: BlockStored | BlockRemoved | AllBlocksCleared) -> None:
        if self._events is not None:
            self._events.emit(event)
