"""The text-feature cache: every key field changes the key; lookups are all-or-nothing and counted
per row; the LRU bound holds; an encoder version change drops everything and re-keys."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given
from hypothesis import strategies as st

from loom_runtime.diffusion.text_feature_cache import TextFeatureCache, TextFeatureKey, token_hash

ids = st.lists(st.integers(0, 2**31 - 1), max_size=40)


@given(ids, ids)
def test_token_hash_is_equal_exactly_for_equal_ids(a: list[int], b: list[int]) -> None:
    assert (token_hash(a) == token_hash(b)) == (a == b)


def test_every_key_field_changes_the_key() -> None:
    base = TextFeatureKey("m", token_hash([1, 2]), "v1", "float32", 16)
    changes = {"model": "m2", "token_hash": token_hash([2, 1]), "encoder_version": "v2",
               "dtype": "bfloat16", "text_len": 32}  # fmt: skip
    assert {f.name for f in dataclasses.fields(TextFeatureKey)} == set(changes)
    for name, value in changes.items():
        assert dataclasses.replace(base, **{name: value}) != base


def cache(capacity: int = 4) -> TextFeatureCache:
    return TextFeatureCache(capacity, "m", torch.float32, 16, "v1")


def test_lookup_is_all_or_nothing_and_counts_rows() -> None:
    c = cache()
    c.store([(1,)], [torch.ones(2)])
    assert c.lookup([(1,), (2,)]) is None
    assert (c.hits, c.misses) == (1, 1)
    found = c.lookup([(1,)])
    assert found is not None and torch.equal(found[0], torch.ones(2))
    assert (c.hits, c.misses) == (2, 1)


def test_the_least_recently_used_row_goes_first() -> None:
    c = cache(capacity=2)
    c.store([(1,), (2,)], [torch.zeros(1), torch.zeros(1)])
    assert c.lookup([(1,)]) is not None  # 2 is now the oldest
    c.store([(3,)], [torch.zeros(1)])
    assert len(c) == 2 and c.lookup([(2,)]) is None and c.lookup([(1,), (3,)]) is not None


def test_stored_features_are_copies() -> None:
    c, t = cache(), torch.zeros(3)
    c.store([(1,)], [t])
    t += 1
    found = c.lookup([(1,)])
    assert found is not None and float(found[0].sum()) == 0


def test_an_encoder_version_change_drops_every_row() -> None:
    c = cache()
    c.store([(1,), (2,)], [torch.zeros(1), torch.zeros(1)])
    assert c.set_encoder_version("v2") == 2
    assert len(c) == 0 and c.lookup([(1,)]) is None
    assert c.key([1]).encoder_version == "v2"


def test_capacity_zero_caches_nothing() -> None:
    c = cache(capacity=0)
    c.store([(1,)], [torch.zeros(1)])
    assert len(c) == 0
