"""Block pool accounting: one state per block, reference counts, LRU eviction, cache events."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from loom_runtime.kv.block_pool import BlockPool
from loom_runtime.kv.errors import BlockStateError, OutOfBlocksError
from loom_runtime.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

BS = 2


class ListSink:
    """Collects emitted events in memory."""

    def __init__(self) -> None:
        self.events: list[KVEvent] = []

    def emit(self, event: KVEvent) -> None:
        self.events.append(event)


def h(n: int) -> bytes:
    return n.to_bytes(32, "big")


def cached_pool(num_blocks: int = 6) -> tuple[BlockPool, ListSink]:
    sink = ListSink()
    return BlockPool(num_blocks, BS, events=sink), sink


def test_allocate_hands_out_distinct_blocks_and_counts_usage() -> None:
    pool, _ = cached_pool(4)
    ids = pool.allocate(3)
    assert len(set(ids)) == 3
    assert all(pool.ref_count(b) == 1 for b in ids)
    assert (pool.num_free, pool.num_used, pool.usage) == (1, 3, 0.75)
    pool.release(ids)
    assert pool.is_whole()
    assert pool.num_cached == 0


def test_allocate_shortfall_raises_and_changes_nothing() -> None:
    pool, sink = cached_pool(3)
    held = pool.allocate(1)
    pool.commit(held[0], h(1), None, [1, 2])
    pool.release(held)
    with pytest.raises(OutOfBlocksError) as err:
        pool.allocate(4)
    assert (err.value.requested, err.value.available) == (4, 3)
    assert pool.evictable() == held  # the cached block was not evicted
    assert pool.num_free == 3
    assert [type(e) for e in sink.events] == [BlockStored]


def test_commit_then_release_makes_a_block_evictable_and_findable() -> None:
    pool, sink = cached_pool()
    [a, b] = pool.allocate(2)
    assert pool.commit_blocks([a, b], [h(1), h(2)], None, [1, 2, 3, 4]) == [True, True]
    assert pool.lookup([h(1), h(2), h(3)]) == [a, b]
    assert pool.lookup([h(2)]) == [b]
    assert pool.lookup([h(9), h(1)]) == []  # the run must start at the first hash
    pool.release([b, a])
    assert pool.evictable() == [b, a]
    assert pool.num_free == 6  # evictable blocks count as allocatable
    assert pool.lookup([h(1), h(2)]) == [a, b]
    assert sink.events == [
        BlockStored(
            block_hashes=(h(1), h(2)),
            parent_block_hash=None,
            token_ids=(1, 2, 3, 4),
            block_size=BS,
            extra_keys=(None, None),
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        )
    ]


def test_acquire_takes_an_evictable_block_out_of_the_lru() -> None:
    pool, _ = cached_pool(3)
    [a] = pool.allocate(1)
    pool.commit(a, h(1), None, [1, 2])
    pool.release([a])
    pool.acquire([a])
    assert pool.ref_count(a) == 1 and pool.evictable() == []
    assert pool.num_free == 2
    pool.acquire([a])
    pool.release([a])
    assert pool.evictable() == []  # still referenced once
    pool.release([a])
    assert pool.evictable() == [a]
    pool.check()


def test_free_blocks_cannot_be_acquired_or_over_released() -> None:
    pool, _ = cached_pool(3)
    [a] = pool.allocate(1)
    with pytest.raises(BlockStateError):
        pool.acquire([a, 2])  # block 2 is free
    assert pool.ref_count(a) == 1  # nothing changed
    with pytest.raises(BlockStateError):
        pool.release([a, a])
    assert pool.ref_count(a) == 1
    with pytest.raises(BlockStateError):
        pool.release([7])


def test_uncached_free_blocks_go_before_cached_ones_and_lru_goes_first() -> None:
    pool, sink = cached_pool(4)
    seq = pool.allocate(3)
    pool.commit_blocks(seq, [h(1), h(2), h(3)], None, [1, 2, 3, 4, 5, 6])
    pool.release(reversed(seq))  # tail first, as a finished request does
    assert pool.evictable() == seq[::-1]
    first = pool.allocate(1)
    assert pool.block_hash(first[0]) is None and pool.lookup([h(1)]) == [seq[0]]
    got = pool.allocate(2)  # evicts the tail, then the middle
    assert got == [seq[2], seq[1]]
    assert sink.events[-1] == BlockRemoved(block_hashes=(h(3), h(2)), group_idx=0)
    assert pool.lookup([h(1), h(2)]) == [seq[0]]


def test_identical_hash_keeps_the_first_block_cached() -> None:
    pool, sink = cached_pool()
    [a, b] = pool.allocate(2)
    assert pool.commit(a, h(1), None, [1, 2]) is True
    assert pool.commit(b, h(1), None, [1, 2]) is False
    assert pool.block_hash(b) is None and pool.lookup([h(1)]) == [a]
    assert len(sink.events) == 1
    pool.release([a, b])
    assert pool.evictable() == [a]  # b went back to the free list
    pool.check()


def test_a_duplicate_inside_a_run_splits_the_stored_events() -> None:
    pool, sink = cached_pool()
    [x] = pool.allocate(1)
    pool.commit(x, h(2), h(1), [3, 4])
    sink.events.clear()
    run = pool.allocate(3)
    registered = pool.commit_blocks(run, [h(1), h(2), h(3)], None, [1, 2, 3, 4, 5, 6])
    assert registered == [True, False, True]
    stored = [(e.block_hashes, e.parent_block_hash, e.token_ids) for e in sink.events]  # type: ignore[union-attr]
    assert stored == [((h(1),), None, (1, 2)), ((h(3),), h(2), (5, 6))]


def test_commit_rejects_misuse() -> None:
    pool, _ = cached_pool()
    [a] = pool.allocate(1)
    with pytest.raises(BlockStateError):
        pool.commit(a, h(1), None, [1, 2, 3])  # not a full block
    with pytest.raises(BlockStateError):
        pool.commit(3, h(1), None, [1, 2])  # not held
    pool.commit(a, h(1), None, [1, 2])
    with pytest.raises(BlockStateError):
        pool.commit(a, h(2), h(1), [1, 2])  # already cached


def test_clear_cache_drops_every_hash_and_frees_evictable_blocks() -> None:
    pool, sink = cached_pool(4)
    [a, b] = pool.allocate(2)
    pool.commit_blocks([a, b], [h(1), h(2)], None, [1, 2, 3, 4])
    pool.release([b])
    assert pool.clear_cache() == 2
    assert sink.events[-1] == AllBlocksCleared()
    assert pool.lookup([h(1)]) == [] and pool.evictable() == []
    assert pool.block_hash(a) is None and pool.ref_count(a) == 1
    pool.release([a])
    assert pool.is_whole()
    assert pool.evictable() == []  # a was uncached, so it went to the free list


def test_check_and_assert_whole_report_problems() -> None:
    pool, _ = cached_pool(3)
    held = pool.allocate(2)
    pool.check()
    assert not pool.is_whole()
    assert pool.leaked() == held
    with pytest.raises(BlockStateError, match="leak"):
        pool.assert_whole()
    pool._ref[2] = 1  # corrupt: block 2 is in the free list and referenced
    with pytest.raises(BlockStateError, match="block 2"):
        pool.check()


class PoolMachine(RuleBasedStateMachine):
    """Drives the pool with random operations against a plain model of every block's state."""

    NUM_BLOCKS = 6

    def __init__(self) -> None:
        super().__init__()
        self.sink = ListSink()
        self.pool = BlockPool(self.NUM_BLOCKS, BS, events=self.sink)
        self.free: deque[int] = deque(range(self.NUM_BLOCKS))
        self.lru: list[int] = []
        self.ref = [0] * self.NUM_BLOCKS
        self.hash_of: dict[int, bytes] = {}
        self.seqs: list[list[int]] = []  # each holds one reference to each of its blocks
        self.removed: list[bytes] = []

    def _take(self, block_ids: list[int]) -> None:
        if block_ids:
            self.seqs.append(block_ids)
        for b in block_ids:
            self.ref[b] += 1

    @rule(n=st.integers(min_value=0, max_value=4))
    def allocate(self, n: int) -> None:
        if n > len(self.free) + len(self.lru):
            with pytest.raises(OutOfBlocksError):
                self.pool.allocate(n)
            return
        expected = []
        for _ in range(n):
            if self.free:
                expected.append(self.free.popleft())
            else:
                b = self.lru.pop(0)
                self.removed.append(self.hash_of.pop(b))
                expected.append(b)
        assert self.pool.allocate(n) == expected
        self._take(expected)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), key=st.integers(min_value=0, max_value=5))
    def commit(self, data: st.DataObject, key: int) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        b = data.draw(st.sampled_from(seq))
        if b in self.hash_of:
            with pytest.raises(BlockStateError):
                self.pool.commit(b, h(key), None, [key, key])
            return
        fresh = h(key) not in self.hash_of.values()
        assert self.pool.commit(b, h(key), None, [key, key]) is fresh
        if fresh:
            self.hash_of[b] = h(key)

    @rule(key=st.integers(min_value=0, max_value=5))
    def hit(self, key: int) -> None:
        found = self.pool.lookup([h(key)])
        expected = [b for b, v in self.hash_of.items() if v == h(key)]
        assert found == expected
        if found:
            self.pool.acquire(found)
            if self.ref[found[0]] == 0:
                self.lru.remove(found[0])
            self._take(found)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        self.seqs.remove(seq)
        self.pool.release(reversed(seq))
        for b in reversed(seq):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (self.lru if b in self.hash_of else self.free).append(b)

    @rule()
    def clear_cache(self) -> None:
        self.pool.clear_cache()
        self.hash_of.clear()
        self.free.extend(self.lru)
        self.lru.clear()

    @invariant()
    def matches_model(self) -> None:
        self.pool.check()
        assert self.pool.evictable() == self.lru
        assert self.pool.num_free == len(self.free) + len(self.lru)
        assert [self.pool.ref_count(b) for b in range(self.NUM_BLOCKS)] == self.ref
        assert {b: self.pool.block_hash(b) for b in self.hash_of} == self.hash_of
        evicted = [
            x for e in self.sink.events if isinstance(e, BlockRemoved) for x in e.block_hashes
        ]
        assert evicted == self.removed

    def teardown(self) -> None:
        for seq in self.seqs:
            self.pool.release(reversed(seq))
        self.pool.assert_whole()


TestPoolStateMachine = PoolMachine.TestCase
TestPoolStateMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
