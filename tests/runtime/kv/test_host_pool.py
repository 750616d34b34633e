"""The host KV tier: bounded in bytes, least recently used out first, bytes kept exactly (any
storage dtype), and every entry and exit announced with medium CPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from loom_runtime.kv.errors import KVConfigError
from loom_runtime.kv.host_pool import HostKVPool
from loom_runtime.wire.kv_events import MEDIUM_CPU, BlockRemoved, BlockStored, EventBuffer

SHAPE = (2, 2, 4, 3)  # layers, k|v, block_size, width: 48 elements a block


def h(i: int) -> bytes:
    return i.to_bytes(8, "big")


def block(i: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(48, dtype=torch.float64).add(i * 100).reshape(SHAPE).to(dtype)


def pool(blocks: int, events: EventBuffer | None = None) -> HostKVPool:
    return HostKVPool(blocks * 48 * 4, SHAPE, torch.float32, block_size=4, events=events)


def test_the_pool_never_holds_more_bytes_than_its_capacity_and_drops_the_oldest() -> None:
    p = pool(3)
    for i in range(5):
        p.store([(h(i), block(i))])
        assert p.stats().used_bytes <= p.stats().capacity_bytes == 3 * 48 * 4
    assert [h(i) in p for i in range(5)] == [False, False, True, True, True]
    assert p.stats().evicted_blocks == 2 and p.stats().stored_blocks == 5


def test_a_touched_block_is_evicted_last() -> None:
    p = pool(3)
    p.store([(h(i), block(i)) for i in range(3)])
    p.touch([h(0), h(1)])
    p.store([(h(3), block(3))])
    assert h(2) not in p and all(h(i) in p for i in (0, 1, 3))


def test_a_pinned_block_is_never_evicted_and_its_slot_never_overwritten() -> None:
    p = pool(2)
    p.store([(h(0), block(0)), (h(1), block(1))])
    p.pin([h(0), h(1)])
    assert p.store([(h(2), block(2))]) == 0  # no room: not kept, nothing overwritten
    assert torch.equal(p.slot_view(h(0)), block(0)) and h(2) not in p
    p.unpin([h(0)])
    p.store([(h(2), block(2))])
    assert h(0) not in p and h(1) in p and h(2) in p
    with pytest.raises(KeyError):
        p.pin([h(0)])


def test_storing_a_held_hash_again_copies_nothing_and_announces_nothing() -> None:
    events = EventBuffer()
    p = pool(2, events)
    assert p.store([(h(0), block(0))]) == 1
    assert p.store([(h(0), block(9))]) == 0
    assert torch.equal(p.slot_view(h(0)), block(0))
    assert len(events.take()) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8, torch.float64])
def test_held_bytes_equal_stored_bytes(dtype: torch.dtype) -> None:
    p = HostKVPool(4 * 48 * dtype.itemsize, SHAPE, dtype, block_size=4)
    p.store([(h(1), block(1, dtype))])
    assert torch.equal(p.slot_view(h(1)), block(1, dtype))


def test_lookup_counts_the_held_run_from_the_first_hash() -> None:
    p = pool(4)
    p.store([(h(i), block(i)) for i in (0, 1, 3)])
    assert p.lookup([h(0), h(1), h(2), h(3)]) == 2
    assert p.lookup([h(2), h(3)]) == 0


def test_events_carry_medium_cpu_like_vllm_offload() -> None:
    events = EventBuffer()
    p = pool(2, events)
    p.store([(h(0), block(0)), (h(1), block(1))])
    p.store([(h(2), block(2))])
    stored, stored2, removed = events.take()
    assert isinstance(stored, BlockStored) and stored.block_hashes == (h(0), h(1))
    assert stored.medium == MEDIUM_CPU and stored.parent_block_hash is None
    assert stored.token_ids == () and stored.block_size == 4
    assert isinstance(stored2, BlockStored) and stored2.block_hashes == (h(2),)
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == (h(0),)
    assert removed.medium == MEDIUM_CPU


def test_a_capacity_below_one_block_is_refused_with_what_to_do() -> None:
    with pytest.raises(KVConfigError, match=r"cannot hold one KV block of 192 bytes; raise"):
        HostKVPool(100, SHAPE, torch.float32, block_size=4)


def test_clear_drops_every_block_and_frees_its_slots() -> None:
    p = pool(2)
    p.store([(h(0), block(0)), (h(1), block(1))])
    assert p.clear() == 2 and len(p) == 0 and p.stats().used_bytes == 0
    assert p.store([(h(2), block(2)), (h(3), block(3))]) == 2
    assert p.stats().evicted_blocks == 0


class HostPoolMachine(RuleBasedStateMachine):
    """Random stores, touches, pins and clears against a model: an LRU list of at most
    `CAPACITY` hashes in which pinned hashes never fall out, every held block's bytes intact."""

    CAPACITY = 3

    def __init__(self) -> None:
        super().__init__()
        self.pool = pool(self.CAPACITY)
        self.lru: list[int] = []  # the model: oldest first
        self.pins: dict[int, int] = {}

    @rule(i=st.integers(0, 7))
    def store(self, i: int) -> None:
        self.pool.store([(h(i), block(i))])
        if i in self.lru:
            self.lru.remove(i)
            self.lru.append(i)
            return
        if len(self.lru) == self.CAPACITY:
            victim = next((o for o in self.lru if o not in self.pins), None)
            if victim is None:
                return
            self.lru.remove(victim)
        self.lru.append(i)

    @rule(i=st.integers(0, 7))
    def touch(self, i: int) -> None:
        self.pool.touch([h(i)])
        if i in self.lru:
            self.lru.remove(i)
            self.lru.append(i)

    @precondition(lambda self: len(self.lru) > 0)
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self.lru))
        self.pool.pin([h(i)])
        self.pins[i] = self.pins.get(i, 0) + 1

    @precondition(lambda self: len(self.pins) > 0)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(sorted(self.pins)))
        self.pool.unpin([h(i)])
        self.pins[i] -= 1
        if not self.pins[i]:
            del self.pins[i]

    @precondition(lambda self: not self.pins)  # weight syncs happen with nothing in flight
    @rule()
    def clear(self) -> None:
        self.pool.clear()
        self.lru.clear()

    @invariant()
    def matches_the_model(self) -> None:
        assert [i for i in range(8) if h(i) in self.pool] == sorted(self.lru)
        assert self.pool.lookup([h(i) for i in self.lru]) == len(self.lru)
        stats = self.pool.stats()
        assert stats.used_bytes == len(self.lru) * 48 * 4 <= stats.capacity_bytes
        for i in self.lru:
            assert torch.equal(self.pool.slot_view(h(i)), block(i))


TestHostPoolMachine = HostPoolMachine.TestCase
TestHostPoolMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
