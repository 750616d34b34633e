from __future__ import annotations

import gc
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_router.core.block_map import BlockMap
from loom_router.errors import ConfigError


class Model:
    """The obvious implementation the BlockMap must agree with."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.entries: OrderedDict[tuple[str, int], int] = OrderedDict()

    def store(self, e: str, k: int, tier: int) -> None:
        if (e, k) in self.entries:
            self.entries[(e, k)] |= tier
            self.entries.move_to_end((e, k))
        else:
            self.entries[(e, k)] = tier
            while len(self.entries) > self.cap:
                self.entries.popitem(last=False)

    def unstore(self, e: str, k: int, tier: int) -> None:
        if (e, k) in self.entries:
            left = self.entries[(e, k)] & ~tier
            if left:
                self.entries[(e, k)] = left
            else:
                del self.entries[(e, k)]

    def drop(self, e: str) -> None:
        for entry in [x for x in self.entries if x[0] == e]:
            del self.entries[entry]

    def match(self, ids: list[str], keys: list[int]) -> dict[str, int]:
        out = {}
        for e in ids:
            n = 0
            while n < len(keys) and (e, keys[n]) in self.entries:
                n += 1
            out[e] = n
        return out


ENDPOINTS = [f"e{i}" for i in range(6)]
op = st.one_of(
    st.tuples(
        st.just("store"), st.sampled_from(ENDPOINTS), st.integers(0, 12), st.sampled_from([1, 2])
    ),
    st.tuples(
        st.just("unstore"), st.sampled_from(ENDPOINTS), st.integers(0, 12), st.sampled_from([1, 2])
    ),
    st.tuples(st.just("drop"), st.sampled_from(ENDPOINTS), st.just(0), st.just(0)),
    st.tuples(st.just("release"), st.sampled_from(ENDPOINTS), st.just(0), st.just(0)),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op, max_size=80), cap=st.integers(1, 30), query=st.lists(st.integers(0, 12)))
def test_block_map_agrees_with_the_obvious_model(
    ops: list[tuple[str, str, int, int]], cap: int, query: list[int]
) -> None:
    real, model = BlockMap(cap), Model(cap)
    for name, e, k, tier in ops:
        if name in ("drop", "release"):
            getattr(real, name)(e)
            model.drop(e)
        else:
            getattr(real, name)(e, k, tier)
            getattr(model, name)(e, k, tier)
        assert len(real) == len(model.entries) <= cap
    assert real.match(ENDPOINTS, query) == model.match(ENDPOINTS, query)
    for e in ENDPOINTS:
        assert real.count(e) == sum(1 for x in model.entries if x[0] == e)


def test_many_endpoints_beyond_one_machine_word() -> None:
    blocks = BlockMap(10_000)
    for i in range(300):
        for k in range(i % 7 + 1):
            blocks.store(f"e{i}", k, 1)
    got = blocks.match([f"e{i}" for i in range(300)], list(range(10)))
    assert got == {f"e{i}": i % 7 + 1 for i in range(300)}


def test_a_released_slot_is_reused_without_stale_blocks() -> None:
    blocks = BlockMap(100)
    blocks.store("old", 1, 1)
    blocks.release("old")
    blocks.store("new", 2, 1)  # takes the freed slot
    assert blocks.match(["old", "new"], [1]) == {"old": 0, "new": 0}
    assert blocks.match(["new"], [2]) == {"new": 1}


def test_entries_create_no_garbage_collected_objects() -> None:
    """A million entries must not mean a million objects for the cyclic GC to walk."""
    blocks = BlockMap(200_000)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(100_000):
        blocks.store(f"e{i % 50}", i * 7919, 1)
    gc.collect()
    assert len(gc.get_objects()) - before < 500


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        BlockMap(0)
