from __future__ import annotations

import pytest

from loom_router.core.approx_index import ApproxIndex, text_keys


def test_text_keys_are_chained_64_char_blocks() -> None:
    text = "x" * 64 * 3 + "tail"
    keys = text_keys(text)
    assert len(keys) == 3  # the partial block is not keyed
    assert len(set(keys)) == 3  # equal blocks at other positions get other keys (chained)
    assert text_keys(text) == keys  # deterministic: replicas and restarts agree
    assert text_keys("y" + text[1:])[1:] != keys[1:]  # a change early changes every later key


def test_shared_prefixes_share_leading_keys() -> None:
    system = "You are a helpful assistant. " * 20
    a = text_keys(system + "What is the capital of France? " * 6)
    b = text_keys(system + "Write a haiku about the sea, please. " * 6)
    shared = len(system) // 64
    assert len(a) > shared + 1 and len(b) > shared + 1
    assert a[:shared] == b[:shared]
    assert all(x != y for x, y in zip(a[shared:], b[shared:], strict=False))


def test_match_counts_what_was_sent_where() -> None:
    index = ApproxIndex()
    keys = text_keys("a" * 640)
    index.record("e1", keys[:6])
    index.record("e2", keys)
    assert index.match(["e1", "e2", "e3"], keys) == {"e1": 6, "e2": 10, "e3": 0}


def test_each_endpoint_is_a_bounded_lru() -> None:
    index = ApproxIndex(max_blocks_per_endpoint=100)
    for i in range(50):
        index.record("e1", text_keys(f"{i:08d}" * 80))  # 10 blocks each
    assert index.entries() == 100 and index.evictions == 400
    newest = text_keys(f"{49:08d}" * 80)
    assert index.match(["e1"], newest) == {"e1": 10}
    assert index.match(["e1"], text_keys(f"{0:08d}" * 80)) == {"e1": 0}


def test_removing_or_clearing_an_endpoint_forgets_it() -> None:
    index = ApproxIndex()
    keys = text_keys("b" * 256)
    index.record("e1", keys)
    index.record("e2", keys)
    index.remove_endpoint("e1")
    index.clear_endpoint("e2")
    assert index.match(["e1", "e2"], keys) == {"e1": 0, "e2": 0}
    assert index.entries() == 0


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ApproxIndex(0)
    with pytest.raises(ValueError):
        text_keys("abc", chars_per_token=0)
