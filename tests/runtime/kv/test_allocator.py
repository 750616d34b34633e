"""Per-request KV operations: prefix hits capped below the prompt, atomic admit/grow, no leaks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_runtime.kv.allocator import KVAllocator
from loom_runtime.kv.block_pool import BlockPool
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.kv.errors import BlockStateError, KVConfigError
from loom_runtime.wire.kv_events import BlockStored, EventBuffer
from loom_runtime.wire.prefix_hash import PrefixHasher

BS = 4


def make(num_blocks: int = 8, events: EventBuffer | None = None) -> KVAllocator:
    return KVAllocator(BlockPool(num_blocks, BS, events=events), PrefixHasher(BS, seed="0"))


def run_prefill(kv: KVAllocator, tokens: list[int]) -> BlockTable:
    """Admit a whole prompt, 'compute' it and commit it, as the engine does in one step."""
    table = BlockTable()
    assert kv.admit(table, tokens, len(tokens))
    kv.commit(table, tokens)
    return table


def pool_state(kv: KVAllocator) -> tuple[object, ...]:
    pool = kv.pool
    refs = tuple(pool.ref_count(b) for b in range(pool.num_blocks))
    return pool.num_free, tuple(pool.evictable()), refs, kv.prefix_queries, kv.prefix_hits


def test_match_never_covers_the_whole_prompt() -> None:
    kv = make()
    prompt = list(range(8))  # exactly two blocks
    kv.free(run_prefill(kv, [*prompt, 99]))
    assert kv.match(prompt) == 4  # capped at (8 - 1) // 4 blocks
    assert kv.match([*prompt, 5]) == 8
    assert kv.match(prompt[:4]) == 0
    assert kv.match([]) == 0
    assert kv.match([1, 2, 3, 4, 5]) == 0  # different first block


def test_admit_takes_prefix_hits_and_counts_them() -> None:
    kv = make()
    first = run_prefill(kv, list(range(10)))
    assert (first.num_cached_tokens, kv.prefix_queries, kv.prefix_hits) == (0, 10, 0)
    cached_ids = first.block_ids[:2]
    kv.free(first)

    table = BlockTable()
    tokens = [*range(8), 50, 51, 52]
    assert kv.admit(table, tokens, len(tokens))
    assert table.block_ids[:2] == cached_ids
    assert (table.num_cached_tokens, table.num_committed, len(table.block_ids)) == (8, 2, 3)
    assert table.hashes == kv.hasher.hash_blocks(tokens)[:2]
    assert (kv.prefix_queries, kv.prefix_hits) == (21, 8)
    assert all(kv.pool.ref_count(b) == 1 for b in table.block_ids)


def test_admit_shortfall_changes_nothing() -> None:
    kv = make(num_blocks=4)
    kv.free(run_prefill(kv, list(range(9))))  # 2 cached (evictable) + 2 free blocks
    before = pool_state(kv)
    table = BlockTable()
    # Prefix hit of 2 blocks + 3 new ones: the evictable hits cannot also be reused.
    assert not kv.admit(table, list(range(9)), 20)
    assert table == BlockTable()
    assert pool_state(kv) == before
    assert kv.admit(table, list(range(9)), 16)  # 2 hits + 2 new fit exactly
    assert kv.pool.num_free == 0


def test_admission_cost_matches_admit_and_accepts_memoized_hashes() -> None:
    kv = make(num_blocks=6)
    kv.free(run_prefill(kv, list(range(9))))  # blocks 0, 1 cached and evictable
    tokens = [*range(8), 70, 71, 72, 73]
    hashes = kv.hasher.hash_blocks(tokens[:8])
    before = pool_state(kv)
    # 2 evictable hits leave the allocatable count, plus 2 new blocks for 12 + 4 tokens.
    assert kv.admission_cost(tokens, 16) == (8, 4)
    assert kv.admission_cost(tokens, 16, hashes) == (8, 4)
    assert kv.admission_cost(tokens, 16, cache_salt="other") == (0, 4)
    assert pool_state(kv) == before  # read-only
    table = BlockTable()
    assert kv.admit(table, tokens, 16, hashes)
    assert (table.num_cached_tokens, kv.pool.num_free) == (8, 2)


def test_split_moves_the_head_blocks_with_their_references() -> None:
    kv = make()
    tokens = list(range(10))
    table = BlockTable()
    assert kv.admit(table, tokens, 14)  # 4 blocks, 2 of them committed below
    kv.commit(table, tokens)
    ids = list(table.block_ids)
    head = kv.split(table, 3)
    assert (head.block_ids, table.block_ids) == (ids[:3], ids[3:])
    assert (head.num_committed, table.num_committed) == (2, 0)
    assert head.hashes == kv.hasher.hash_blocks(tokens[:8]) and table.hashes == []
    kv.free(table)
    assert kv.pool.leaked() == sorted(ids[:3])  # the head still holds its blocks
    kv.free(head)
    kv.pool.assert_whole()
    with pytest.raises(BlockStateError, match="cannot split"):
        kv.split(BlockTable(), 1)


def test_admit_requires_an_empty_table() -> None:
    kv = make()
    table = run_prefill(kv, [1, 2, 3, 4, 5])
    with pytest.raises(BlockStateError):
        kv.admit(table, [1, 2, 3], 3)


def test_grow_is_all_or_nothing() -> None:
    kv = make(num_blocks=3)
    table = BlockTable()
    assert kv.admit(table, [1, 2, 3], 3)
    assert kv.grow(table, 4) and len(table.block_ids) == 1  # still fits
    assert not kv.grow(table, 13)  # needs 4 blocks, pool has 3
    assert len(table.block_ids) == 1 and kv.pool.num_free == 2
    assert kv.grow(table, 12) and len(table.block_ids) == 3


def test_commit_registers_only_full_blocks_and_emits_one_event_per_step() -> None:
    buffer = EventBuffer()
    kv = make(events=buffer)
    table = BlockTable(cache_salt="tenant-a")
    tokens = list(range(10))
    assert kv.admit(table, tokens, 10)
    kv.commit(table, tokens[:3])
    assert table.num_committed == 0 and buffer.take() == []
    kv.commit(table, tokens)
    assert table.num_committed == 2
    assert table.hashes == kv.hasher.hash_blocks(tokens, cache_salt="tenant-a")
    [event] = buffer.take()
    assert isinstance(event, BlockStored)
    assert event.block_hashes == tuple(table.hashes)
    assert event.parent_block_hash is None and event.token_ids == tuple(range(8))
    assert event.extra_keys == (("tenant-a",), None)
    tokens += [10, 11]  # a decode step completes block 2
    kv.grow(table, len(tokens))
    kv.commit(table, tokens)
    [event] = buffer.take()
    assert isinstance(event, BlockStored)
    assert event.parent_block_hash == table.hashes[1] and event.token_ids == (8, 9, 10, 11)
    with pytest.raises(BlockStateError):
        kv.commit(table, tokens + list(range(8)))  # KV of tokens with no block


def test_cache_salt_isolates_prefixes() -> None:
    kv = make()
    tokens = list(range(9))
    kv.free(run_prefill(kv, tokens))
    assert kv.match(tokens, cache_salt="other") == 0
    salted = BlockTable(cache_salt="tenant-a")
    assert kv.admit(salted, tokens, 9) and salted.num_cached_tokens == 0
    kv.commit(salted, tokens)
    kv.free(salted)
    assert kv.match(tokens, cache_salt="tenant-a") == 8
    assert kv.match(tokens) == 8


def test_generated_tokens_become_prefix_hits_for_a_replay() -> None:
    kv = make()
    table = BlockTable()
    prompt, output = [1, 2, 3, 4, 5, 6], [7, 8, 9]
    assert kv.admit(table, prompt, len(prompt))
    kv.commit(table, prompt)
    computed = prompt + output[:2]  # the last sampled token has no KV yet
    assert kv.grow(table, len(computed) + 1)
    kv.commit(table, computed)
    kv.free(table)
    # A migrated request replays prompt + output: both full blocks are hits.
    assert kv.match(prompt + output) == 8


def test_free_returns_the_pool_to_whole_with_tails_evicted_first() -> None:
    kv = make()
    table = run_prefill(kv, list(range(13)))
    ids = list(table.block_ids)
    kv.free(table)
    assert table == BlockTable()
    kv.pool.assert_whole()
    # Uncached tail block went to the free list; cached ones are evictable, tail first.
    assert kv.pool.evictable() == ids[:3][::-1]


def test_reset_prefix_cache_forgets_every_prefix() -> None:
    kv = make()
    kv.free(run_prefill(kv, list(range(9))))
    assert kv.match(list(range(9))) == 8
    assert kv.reset_prefix_cache() == 2
    assert kv.match(list(range(9))) == 0
    kv.pool.assert_whole()


def test_pool_and_hasher_must_agree_on_block_size() -> None:
    with pytest.raises(KVConfigError):
        KVAllocator(BlockPool(4, 4), PrefixHasher(8))


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(
        st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=14),
        min_size=1,
        max_size=8,
    ),
    frees=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_any_request_mix_leaves_the_pool_whole(prompts: list[list[int]], frees: list[bool]) -> None:
    kv = make(num_blocks=10)
    live: list[BlockTable] = []
    for prompt, free_now in zip(prompts, frees, strict=False):
        expected_hit = kv.match(prompt)
        assert expected_hit % BS == 0 and expected_hit < len(prompt)
        cost_hit, consumed = kv.admission_cost(prompt, len(prompt) + 1)
        assert cost_hit == expected_hit
        free_before = kv.pool.num_free
        table = BlockTable()
        if not kv.admit(table, prompt, len(prompt) + 1):
            assert table == BlockTable()
            assert consumed > free_before
            continue
        assert table.num_cached_tokens == expected_hit
        assert free_before - kv.pool.num_free == consumed  # the cost admit actually paid
        kv.commit(table, prompt)
        kv.pool.check()
        if free_now:
            kv.free(table)
        else:
            live.append(table)
    for table in live:
        kv.free(table)
    kv.pool.assert_whole()
    assert kv.prefix_hits <= kv.prefix_queries
