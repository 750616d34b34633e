"""Prefix hashes match vLLM's definition bit for bit, chain correctly and honour seed and salt."""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

import cbor2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_runtime.wire.errors import WireConfigError
from loom_runtime.wire.prefix_hash import PrefixHasher, sha256_cbor

# NONE_HASH for PYTHONHASHSEED=0 under sha256_cbor, as published by independent vLLM-compatible
# routers (the SHA-256 of canonical CBOR "0", bytes 61 30).
NONE_HASH_SEED_0 = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
# A third-party sha256_cbor vector: H((NONE_HASH, (1, 2, 3), ())) with seed "0".
THIRD_PARTY_123_EMPTY_EXTRA = "8850135ef1d7b33ac0b6e79034c039d9eb7beea6fc15fa9d826602f68aa4fb2d"


def vllm_sha256_cbor(obj: Any) -> bytes:
    """vllm/utils/hashing.py sha256_cbor, written out independently of Loom."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def vllm_chain(
    tokens: list[int], block_size: int, seed: str, salt: str | None = None
) -> list[bytes]:
    """vLLM's request block hasher + hash_block_tokens for a plain (optionally salted) request."""
    none_hash = vllm_sha256_cbor(seed)
    out: list[bytes] = []
    parent: bytes | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra = (salt,) if (start == 0 and salt) else None
        chained = parent if parent else none_hash
        parent = vllm_sha256_cbor((chained, tuple(tokens[start : start + block_size]), extra))
        out.append(parent)
    return out


def test_none_hash_is_sha256_cbor_of_the_seed() -> None:
    hasher = PrefixHasher(block_size=16, seed="0")
    assert hasher.none_hash.hex() == NONE_HASH_SEED_0
    assert PrefixHasher(block_size=16, seed="42").none_hash == vllm_sha256_cbor("42")


def test_third_party_vector_reproduces() -> None:
    hasher = PrefixHasher(block_size=3, seed="0")
    assert hasher.hash_block(None, [1, 2, 3], ()).hex() == THIRD_PARTY_123_EMPTY_EXTRA
    assert sha256_cbor((hasher.none_hash, (1, 2, 3), ())).hex() == THIRD_PARTY_123_EMPTY_EXTRA


def test_chain_matches_vllm_definition() -> None:
    tokens = [7, 300, 70000, 0, 1, 2, 151643, 5, 9, 9, 9, 9, 1, 2, 3]  # + a partial block
    hasher = PrefixHasher(block_size=4, seed="0")
    expected = vllm_chain(tokens, 4, "0")
    assert len(expected) == 3
    assert hasher.hash_blocks(tokens) == expected
    # Each block chains from the previous one; the first from NONE_HASH with extra_keys None.
    assert expected[0] == vllm_sha256_cbor((hasher.none_hash, (7, 300, 70000, 0), None))
    assert expected[2] == vllm_sha256_cbor((expected[1], (9, 9, 9, 9), None))


def test_partial_blocks_are_not_hashed() -> None:
    hasher = PrefixHasher(block_size=4)
    assert hasher.hash_blocks([1, 2, 3]) == []
    assert len(hasher.hash_blocks(list(range(11)))) == 2
    with pytest.raises(WireConfigError):
        hasher.hash_block(None, [1, 2, 3])


def test_seed_changes_every_hash() -> None:
    tokens = list(range(40))
    a = PrefixHasher(block_size=8, seed="0").hash_blocks(tokens)
    b = PrefixHasher(block_size=8, seed="1").hash_blocks(tokens)
    assert len(a) == len(b) == 5
    assert all(x != y for x, y in zip(a, b, strict=True))


def test_no_seed_is_random_per_hasher_like_vllm_without_pythonhashseed() -> None:
    a, b = PrefixHasher(block_size=4, seed=None), PrefixHasher(block_size=4, seed=None)
    assert len(a.none_hash) == 32
    assert a.none_hash != b.none_hash
    assert a.hash_blocks([1, 2, 3, 4]) != b.hash_blocks([1, 2, 3, 4])


def test_cache_salt_is_an_extra_key_of_the_first_block_only() -> None:
    tokens = list(range(12))
    hasher = PrefixHasher(block_size=4, seed="0")
    salted = hasher.hash_blocks(tokens, cache_salt="tenant-a")
    assert salted == vllm_chain(tokens, 4, "0", salt="tenant-a")
    plain = hasher.hash_blocks(tokens)
    assert all(s != p for s, p in zip(salted, plain, strict=True))  # the salt reaches every link
    # Block 1 carries no extra key: it is H((salted block 0, tokens, None)).
    assert salted[1] == vllm_sha256_cbor((salted[0], (4, 5, 6, 7), None))
    # Resuming mid-sequence with the salt given still applies it to block 0 only.
    assert hasher.hash_blocks(tokens, salted[0], 1, cache_salt="tenant-a") == salted[1:]
    # An empty salt is no salt (vLLM tests it for truth).
    assert hasher.hash_blocks(tokens, cache_salt="") == plain


def test_lora_name_is_an_extra_key_of_every_block_before_the_salt() -> None:
    hasher = PrefixHasher(block_size=2, seed="0")
    hashes = hasher.hash_blocks([1, 2, 3, 4], cache_salt="s", lora_name="adapter")
    first = vllm_sha256_cbor((hasher.none_hash, (1, 2), ("adapter", "s")))
    assert hashes == [first, vllm_sha256_cbor((first, (3, 4), ("adapter",)))]


def test_numpy_token_ids_hash_like_python_ints() -> None:
    hasher = PrefixHasher(block_size=4)
    tokens = [5, 6, 70000, 8]
    assert hasher.hash_blocks(list(np.array(tokens, dtype=np.int64))) == hasher.hash_blocks(tokens)


def test_sha256_pickle_algorithm_matches_vllm_sha256() -> None:
    def vllm_sha256(obj: Any) -> bytes:
        return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()

    hasher = PrefixHasher(block_size=2, seed="0", algo="sha256")
    assert hasher.none_hash == vllm_sha256("0")
    assert hasher.hash_blocks([1, 2]) == [vllm_sha256((vllm_sha256("0"), (1, 2), None))]


def test_bad_settings_are_typed_errors() -> None:
    with pytest.raises(WireConfigError, match="xxhash"):
        PrefixHasher(block_size=4, algo="xxhash")
    with pytest.raises(WireConfigError):
        PrefixHasher(block_size=0)


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(min_value=0, max_value=200_000), max_size=40),
    block_size=st.integers(min_value=1, max_value=6),
    cut=st.integers(min_value=0, max_value=40),
)
def test_hashes_of_a_prefix_are_a_prefix_of_the_hashes(
    tokens: list[int], block_size: int, cut: int
) -> None:
    hasher = PrefixHasher(block_size=block_size, seed="0")
    full = hasher.hash_blocks(tokens)
    assert len(full) == len(tokens) // block_size
    prefix = tokens[:cut]
    assert hasher.hash_blocks(prefix) == full[: len(prefix) // block_size]
    # Resuming from any block with its parent gives the rest of the chain.
    start = min(cut // block_size, len(full))
    parent = full[start - 1] if start else None
    assert hasher.hash_blocks(tokens, parent, start) == full[start:]
