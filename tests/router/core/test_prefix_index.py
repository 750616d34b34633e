from __future__ import annotations

import pytest

from loom_router.core.kv_events import DecodedBatch, EventMessage, index_key
from loom_router.core.prefix_index import PrefixIndex, SeqCheck
from loom_runtime.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from loom_runtime.wire.prefix_hash import PrefixHasher

BS = 4


def h(i: int) -> bytes:
    """An int-format wire hash as the decoder yields it (index key == i)."""
    return i.to_bytes(8, "big")


def stored(keys: list[int], medium: str = "GPU") -> BlockStored:
    return BlockStored(
        block_hashes=tuple(h(k) for k in keys),
        parent_block_hash=None,
        token_ids=tuple(range(BS * len(keys))),
        block_size=BS,
        medium=medium,
    )


def removed(keys: list[int], medium: str = "GPU") -> BlockRemoved:
    return BlockRemoved(block_hashes=tuple(h(k) for k in keys), medium=medium)


def feed(index: PrefixIndex, endpoint_id: str, *events: KVEvent, dp_rank: int = 0) -> None:
    index.apply_batch(endpoint_id, DecodedBatch(0.0, tuple(events), dp_rank))


def msg(seq: int, *events: KVEvent) -> EventMessage:
    return EventMessage("kv-events", seq, DecodedBatch(0.0, tuple(events), 0))


def test_match_counts_consecutive_blocks_from_the_first() -> None:
    index = PrefixIndex()
    feed(index, "a", stored([1, 2, 3]))
    feed(index, "b", stored([1, 2]))
    feed(index, "c", stored([2, 3]))  # holds later blocks but not the first: no prefix
    assert index.match(["a", "b", "c", "d"], [1, 2, 3, 4]) == {"a": 3, "b": 2, "c": 0, "d": 0}
    assert index.match(["a"], []) == {"a": 0}


def test_block_removed_cuts_the_prefix_at_the_gap() -> None:
    index = PrefixIndex()
    feed(index, "a", stored([1, 2, 3]))
    feed(index, "a", removed([2]))
    assert index.match(["a"], [1, 2, 3]) == {"a": 1}
    assert index.blocks_of("a") == 2


def test_all_blocks_cleared_drops_only_that_endpoints_blocks() -> None:
    index = PrefixIndex()
    feed(index, "a", stored([1, 2]))
    feed(index, "b", stored([1, 2]))
    feed(index, "a", AllBlocksCleared())
    assert index.match(["a", "b"], [1, 2]) == {"a": 0, "b": 2}
    assert index.stats().entries == 2 and index.stats().clears == 1


def test_removing_an_endpoint_drops_its_entries() -> None:
    index = PrefixIndex()
    feed(index, "a", stored([1, 2, 3]))
    feed(index, "b", stored([1]))
    index.remove_endpoint("a")
    assert index.match(["a", "b"], [1, 2, 3]) == {"a": 0, "b": 1}
    assert index.stats().entries == 1 and index.stats().endpoints == 1


def test_a_block_stays_while_any_tier_holds_it() -> None:
    index = PrefixIndex()
    feed(index, "a", stored([1], medium="GPU"), stored([1], medium="CPU"))
    feed(index, "a", removed([1], medium="GPU"))
    assert index.match(["a"], [1]) == {"a": 1}  # still in the host tier
    feed(index, "a", removed([1], medium="CPU"))
    assert index.match(["a"], [1]) == {"a": 0}


def test_dp_ranks_of_one_endpoint_are_separate_tiers() -> None:
    index = PrefixIndex()
    feed(index, "a", stored([1]), dp_rank=0)
    feed(index, "a", stored([1]), dp_rank=1)
    feed(index, "a", removed([1]), dp_rank=0)
    assert index.match(["a"], [1]) == {"a": 1}


def test_memory_stays_bounded_with_100k_distinct_prefixes() -> None:
    cap = 5_000
    index = PrefixIndex(max_entries=cap)
    for i in range(100_000):
        feed(index, f"e{i % 8}", stored([2 * i, 2 * i + 1]))
    stats = index.stats()
    assert cap - cap // 64 <= stats.entries <= cap  # evicted in batches of cap // 64
    assert stats.entries + stats.evictions == 200_000  # every block counted once
    # The newest prefixes are kept, the oldest evicted.
    last = 99_999
    assert index.match([f"e{last % 8}"], [2 * last, 2 * last + 1]) == {f"e{last % 8}": 2}
    assert index.match(["e0"], [0, 1]) == {"e0": 0}


def test_storing_again_refreshes_lru_position() -> None:
    index = PrefixIndex(max_entries=3)
    feed(index, "a", stored([1]), stored([2]), stored([3]))
    feed(index, "a", stored([1]))  # 1 is now the newest
    feed(index, "a", stored([4]))  # evicts 2, the oldest
    assert index.match(["a"], [1]) == {"a": 1}
    assert index.match(["a"], [2]) == {"a": 0}
    assert index.stats().evictions == 1


@pytest.mark.parametrize(
    ("seqs", "expected"),
    [
        ([0], SeqCheck("first")),
        ([0, 1], SeqCheck("in_order")),
        ([5], SeqCheck("gap", 0, 4)),  # joined late: ask for what the publisher still has
        ([0, 1, 4], SeqCheck("gap", 2, 3)),
        ([0, 1, 2, 0], SeqCheck("restart")),
        ([0, 1, 9, 3], SeqCheck("restart", 0, 2)),
    ],
)
def test_sequence_numbers_reveal_gaps_and_restarts(seqs: list[int], expected: SeqCheck) -> None:
    index = PrefixIndex()
    checks = [index.apply_message("a", msg(s)) for s in seqs]
    assert checks[-1] == expected


def test_a_restart_drops_the_endpoints_blocks() -> None:
    index = PrefixIndex()
    index.apply_message("a", msg(0, stored([1, 2])))
    index.apply_message("a", msg(1))
    assert index.apply_message("a", msg(0, stored([7]))).status == "restart"
    assert index.match(["a"], [1]) == {"a": 0}
    assert index.match(["a"], [7]) == {"a": 1}
    assert index.stats().restarts == 1


def test_replay_fills_a_gap_and_nothing_else() -> None:
    index = PrefixIndex()
    index.apply_message("a", msg(0, stored([1])))
    check = index.apply_message("a", msg(3, stored([9])))
    assert (check.replay_from, check.replay_to) == (1, 2)
    assert index.apply_replay("a", msg(1, stored([1, 2])))
    assert not index.apply_replay("a", msg(0, stored([5])))  # before the gap
    assert not index.apply_replay("a", msg(3, stored([6])))  # after it
    assert index.pending_replay("a") == (1, 2)
    assert index.apply_replay("a", msg(2, stored([1, 2, 3])))
    assert index.pending_replay("a") is None  # the last missed batch closes the window
    assert not index.apply_replay("a", msg(2, stored([7])))
    assert index.match(["a"], [1, 2, 3]) == {"a": 3}
    assert index.match(["a"], [5]) == {"a": 0}
    assert index.stats().gaps == 1


def test_end_replay_stops_waiting() -> None:
    index = PrefixIndex()
    index.apply_message("a", msg(4))
    index.end_replay("a")
    assert index.pending_replay("a") is None
    assert not index.apply_replay("a", msg(1, stored([1])))


def hashed_event(hasher: PrefixHasher, tokens: list[int], block_size: int) -> BlockStored:
    hashes = hasher.hash_blocks(tokens)
    return BlockStored(
        block_hashes=tuple(index_key(x).to_bytes(8, "big") for x in hashes),
        parent_block_hash=None,
        token_ids=tuple(tokens),
        block_size=block_size,
        extra_keys=(None,) * len(hashes),
    )


def test_events_hashed_with_another_seed_are_flagged_not_stored() -> None:
    router = PrefixHasher(BS, seed="0")
    index = PrefixIndex(hasher=router)
    tokens = list(range(8))
    feed(index, "wrong", hashed_event(PrefixHasher(BS, seed="1"), tokens, BS))
    feed(index, "right", hashed_event(router, tokens, BS))
    keys = [index_key(x) for x in router.hash_blocks(tokens)]
    assert index.match(["wrong", "right"], keys) == {"wrong": 0, "right": 2}
    problems = index.stats().hash_problems
    assert set(problems) == {"wrong"} and "hashSeed" in problems["wrong"]
    # Once the engine is fixed, a good event clears the flag.
    feed(index, "wrong", hashed_event(router, tokens, BS))
    assert index.match(["wrong"], keys) == {"wrong": 2}
    assert not index.stats().hash_problems


def test_events_with_another_block_size_are_flagged() -> None:
    index = PrefixIndex(hasher=PrefixHasher(BS, seed="0"))
    other = PrefixHasher(8, seed="0")
    feed(index, "a", hashed_event(other, list(range(16)), 8))
    assert "block size 8" in index.stats().hash_problems["a"]
    assert index.stats().entries == 0


def offloaded(keys: list[int]) -> BlockStored:
    """A host tier's store as vLLM's CPU offload (and Loom's) sends it: no parent, no tokens."""
    return BlockStored(tuple(h(k) for k in keys), None, (), BS, medium="CPU")


def test_host_blocks_are_the_run_after_the_device_resident_one() -> None:
    index = PrefixIndex()
    feed(index, "a", stored([1, 2, 3, 4]))
    feed(index, "a", offloaded([3, 4]), removed([3, 4]))  # evicted to the host tier
    feed(index, "b", stored([1, 2, 3, 4]))
    feed(index, "c", offloaded([1, 2]))  # everything only in host memory
    keys = [1, 2, 3, 4]
    assert index.match(["a", "b", "c"], keys) == {"a": 4, "b": 4, "c": 2}
    assert index.host_blocks(["a", "b", "c"], keys) == {"a": 2, "b": 0, "c": 2}
    feed(index, "a", removed([4], medium="CPU"))  # the host tier dropped it: gone for good
    assert index.match(["a"], keys) == {"a": 3}
    assert index.host_blocks(["a"], keys) == {"a": 1}


def test_without_host_tiers_no_block_is_a_host_block() -> None:
    index = PrefixIndex()
    feed(index, "a", stored([1, 2]))
    assert index.host_blocks(["a", "z"], [1, 2]) == {"a": 0, "z": 0}


def test_a_host_tiers_tokenless_stores_are_not_hash_checked() -> None:
    router = PrefixHasher(BS, seed="0")
    index = PrefixIndex(hasher=router)
    tokens = list(range(8))
    keys = [index_key(x) for x in router.hash_blocks(tokens)]
    placeholder = BlockStored(tuple(router.hash_blocks(tokens)), None, (), 0, medium="CPU")
    feed(index, "a", placeholder)  # newer vLLM says block size 0 in these
    assert not index.stats().hash_problems
    assert index.match(["a"], keys) == {"a": 2}
    assert index.host_blocks(["a"], keys) == {"a": 2}
