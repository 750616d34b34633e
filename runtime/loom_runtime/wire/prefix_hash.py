"""Chained prefix-block hashes, bit-compatible with vLLM's `hash_block_tokens` and `NONE_HASH`.

Owns the hash function and the chaining rule only; never looks at which blocks are cached.

Block i's hash is H((parent or NONE_HASH, tuple(block tokens), extra_keys or None)), where
H is vLLM's `sha256_cbor` (SHA-256 over canonical CBOR) by default and NONE_HASH = H(seed),
the seed being what vLLM reads from PYTHONHASHSEED. A router predicts hits on a worker only
if block size, seed and algorithm all match that worker's.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cbor2

from loom_runtime.wire.errors import WireConfigError

BlockHash = bytes
"""A block's full digest (32 bytes for the SHA-256 algorithms)."""

ExtraKeys = tuple[Any, ...]


def sha256_cbor(obj: Any) -> bytes:
    """vLLM's `sha256_cbor`: SHA-256 of the canonical CBOR encoding; portable across languages."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def sha256_pickle(obj: Any) -> bytes:
    """vLLM's `sha256`: SHA-256 of the highest-protocol pickle (only dumps, never loads).

    Reproducible only between Python versions that pickle alike; prefer `sha256_cbor`.
    """
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


HASH_ALGORITHMS: dict[str, Callable[[Any], bytes]] = {
    "sha256_cbor": sha256_cbor,
    "sha256": sha256_pickle,
}
"""vLLM's `--prefix-caching-hash-algo` names that Loom implements (xxhash ones are not)."""


def _hash_fn(algo: str) -> Callable[[Any], bytes]:
    try:
        return HASH_ALGORITHMS[algo]
    except KeyError:
        raise WireConfigError(
            f"unknown prefix hash algorithm {algo!r}; use one of {sorted(HASH_ALGORITHMS)}"
        ) from None


def _none_hash(algo: str, seed: str | None) -> BlockHash:
    # vLLM's init_none_hash: random per process without a seed, else H(seed) with the same H.
    if seed is None:
        return os.urandom(32)
    return _hash_fn(algo)(seed)


@dataclass(frozen=True)
class PrefixHasher:
    """Hashes full blocks of token ids into a chain. Immutable, so one instance serves all."""

    block_size: int
    seed: str | None = "0"
    algo: str = "sha256_cbor"
    none_hash: BlockHash = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise WireConfigError(f"block_size must be positive, got {self.block_size}")
        object.__setattr__(self, "none_hash", _none_hash(self.algo, self.seed))

    def hash_block(
        self,
        parent: BlockHash | None,
        token_ids: Sequence[int],
        extra_keys: ExtraKeys | None = None,
    ) -> BlockHash:
        """Hash one full block given its parent's hash (None for the first block)."""
        if len(token_ids) != self.block_size:
            raise WireConfigError(
                f"only full blocks are hashed: got {len(token_ids)} tokens, "
                f"block_size is {self.block_size}"
            )
        chained = parent if parent else self.none_hash  # vLLM: `if not parent_block_hash`
        tokens = tuple(int(t) for t in token_ids)  # numpy/torch ints would hash differently
        return _hash_fn(self.algo)((chained, tokens, extra_keys))

    def extra_keys(
        self, block_index: int, cache_salt: str | None = None, lora_name: str | None = None
    ) -> ExtraKeys | None:
        """vLLM's extra keys for block `block_index`: LoRA name, then the salt (block 0 only)."""
        keys: list[Any] = []
        if lora_name is not None:
            keys.append(lora_name)
        if block_index == 0 and cache_salt:
            keys.append(cache_salt)
        return tuple(keys) if keys else None

    def hash_blocks(
        self,
        token_ids: Sequence[int],
        parent: BlockHash | None = None,
        start_block: int = 0,
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> list[BlockHash]:
        """Hashes of the full blocks from `start_block` on; a trailing partial block is skipped.

        `token_ids` starts at token 0 of the sequence; `parent` is the hash of block
        `start_block - 1` (None when starting at block 0).
        """
        if start_block < 0:
            raise WireConfigError(f"start_block must be >= 0, got {start_block}")
        bs = self.block_size
        hashes: list[BlockHash] = []
        prev = parent
        for i in range(start_block, len(token_ids) // bs):
            block = token_ids[i * bs : (i + 1) * bs]
            prev = self.hash_block(prev, block, self.extra_keys(i, cache_salt, lora_name))
            hashes.append(prev)
        return hashes
