"""The approximate prefix index: what the router sent where, keyed by hashed prompt text.

Owns text block keys (~4 characters per token, 16-token blocks, llm-d's approximation) and a
bounded LRU per endpoint; never sees KV events, so each router replica learns only from itself.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Sequence
from itertools import islice

from loom_router.errors import ConfigError

CHARS_PER_TOKEN = 4
TOKENS_PER_BLOCK = 16


def text_keys(
    text: str,
    chars_per_token: int = CHARS_PER_TOKEN,
    tokens_per_block: int = TOKENS_PER_BLOCK,
    max_blocks: int = 16_384,
) -> tuple[int, ...]:
    """Chained 64-bit keys of the text's full blocks (a trailing partial block is skipped).

    Block i's key hashes block i's characters with block i-1's key, so equal keys mean equal
    prefixes. BLAKE2b, not Python's `hash`: every replica and restart must agree.
    """
    if chars_per_token <= 0 or tokens_per_block <= 0:
        raise ConfigError("chars_per_token and tokens_per_block must be positive")
    width = chars_per_token * tokens_per_block
    keys: list[int] = []
    parent = b"\x00" * 8
    for start in range(0, min(len(text) // width, max_blocks) * width, width):
        digest = hashlib.blake2b(
            text[start : start + width].encode("utf-8", errors="surrogatepass"),
            digest_size=8,
            key=parent,
        ).digest()
        keys.append(int.from_bytes(digest, "big"))
        parent = digest
    return tuple(keys)


class ApproxIndex:
    """Per endpoint, an LRU of the text block keys the router sent there (at most
    `max_blocks_per_endpoint` each; llm-d's default is 31,250). Thread-safe (one lock).

    Each LRU is a plain dict of ints in insertion order (refreshed by re-inserting), which the
    garbage collector does not walk; when full, the oldest 1/64 goes at once.
    """

    def __init__(self, max_blocks_per_endpoint: int = 31_250) -> None:
        if max_blocks_per_endpoint <= 0:
            raise ConfigError("max_blocks_per_endpoint must be positive")
        self.max_blocks_per_endpoint = max_blocks_per_endpoint
        self._batch = max(1, max_blocks_per_endpoint // 64)
        self._lock = threading.Lock()
        self._blocks: dict[str, dict[int, None]] = {}
        self._evictions = 0

    def record(self, endpoint_id: str, keys: Sequence[int]) -> None:
        """The router sent a prompt with these keys to the endpoint: it will cache them."""
        with self._lock:
            lru = self._blocks.setdefault(endpoint_id, {})
            for key in keys:
                lru.pop(key, None)
                lru[key] = None
            excess = len(lru) - self.max_blocks_per_endpoint
            if excess > 0:
                count = min(len(lru), excess + self._batch - 1)
                for key in list(islice(lru, count)):
                    del lru[key]
                self._evictions += count

    def match(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        """Consecutive blocks from the first key the router sent to each endpoint."""
        counts: dict[str, int] = {}
        with self._lock:
            for endpoint_id in endpoint_ids:
                lru = self._blocks.get(endpoint_id)
                depth = 0
                if lru:
                    for key in keys:
                        if key not in lru:
                            break
                        depth += 1
                counts[endpoint_id] = depth
        return counts

    def host_blocks(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        """The approximate index knows no tiers: every match counts as device-resident."""
        return dict.fromkeys(endpoint_ids, 0)

    def remove_endpoint(self, endpoint_id: str) -> None:
        with self._lock:
            self._blocks.pop(endpoint_id, None)

    def clear_endpoint(self, endpoint_id: str) -> None:
        """Its cache was dropped (a weight sync): nothing sent there is cached any more."""
        self.remove_endpoint(endpoint_id)

    def entries(self) -> int:
        with self._lock:
            return sum(len(lru) for lru in self._blocks.values())

    @property
    def evictions(self) -> int:
        with self._lock:
            return self._evictions
