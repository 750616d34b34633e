"""The precise prefix index: which endpoint holds which prefix block, fed by the engines' KV events.

Owns the bounded block map, per-endpoint sequence tracking and hash checks; never reads sockets
(the subscriber shell does) and never grows past `max_entries`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from loom_router.core.block_map import BlockMap
from loom_router.core.hash_check import checkable, hash_problem
from loom_router.core.kv_events import DecodedBatch, EventMessage, index_key
from loom_router.errors import ConfigError
from loom_runtime.wire.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockStored, KVEvent
from loom_runtime.wire.prefix_hash import PrefixHasher

SeqStatus = Literal["first", "in_order", "gap", "restart"]
_MAX_TIER_BITS = 62  # tiers beyond this share the last bit (a removal may then drop early)


@dataclass(frozen=True)
class SeqCheck:
    """What a live batch's sequence number says. When `replay_from` is set, ask the endpoint's
    replay socket for [replay_from, replay_to] and feed the answers to `apply_replay`.

    first: the first batch seen (seq 0: nothing missed); gap: batches were missed; restart: the
    sequence went back (the publisher restarted), so the endpoint's blocks were dropped.
    """

    status: SeqStatus
    replay_from: int | None = None
    replay_to: int | None = None


@dataclass(frozen=True)
class IndexStats:
    entries: int
    max_entries: int
    endpoints: int
    evictions: int
    """Entries dropped to stay under max_entries."""
    stored: int
    removed: int
    clears: int
    gaps: int
    restarts: int
    hash_problems: Mapping[str, str]
    """Endpoints whose events can never match the router's hashes, and why."""


class PrefixIndex:
    """(endpoint, block key) entries under one LRU cap, keyed by the low 64 bits of block hashes.

    An entry is held per tier (medium, dp rank, KV group) and leaves when its last tier removes
    it. Storing refreshes an entry's LRU position; matching does not. Thread-safe (one lock):
    the subscriber may feed it from another thread than the one that routes.

    A tier whose medium is not GPU (vLLM's and Loom's CPU KV offload: medium "CPU") is a host
    tier: `host_blocks` says how much of a match only a host tier holds (an engine reloads it
    instead of recomputing it, which costs a copy; the prefix scorer discounts it).
    """

    def __init__(
        self,
        max_entries: int = 1_000_000,
        hasher: PrefixHasher | None = None,
        verify_every: int = 64,
    ) -> None:
        if verify_every <= 0:
            raise ConfigError(f"verify_every must be positive, got {verify_every}")
        self.max_entries = max_entries
        self._blocks = BlockMap(max_entries)
        self._hasher = hasher
        self._verify_every = verify_every
        self._lock = threading.Lock()
        self._tiers: dict[tuple[str, int, int], int] = {}
        self._host_bits = 0  # bits of the tiers whose medium is not GPU
        self._last_seq: dict[str, int] = {}
        self._pending: dict[str, tuple[int, int]] = {}
        self._stored_events: dict[str, int] = {}
        self._problems: dict[str, str] = {}
        self._verified: set[str] = set()
        self._stored = self._removed = 0
        self._clears = self._gaps = self._restarts = 0

    # --- feeding ------------------------------------------------------------------------------

    def apply_message(self, endpoint_id: str, message: EventMessage) -> SeqCheck:
        """Apply a live PUB batch and check its sequence number against the previous one."""
        with self._lock:
            check = self._check_seq(endpoint_id, message.seq)
            self._apply(endpoint_id, message.batch)
            return check

    def apply_replay(self, endpoint_id: str, message: EventMessage) -> bool:
        """Apply a replayed batch if it falls in the endpoint's missed range; False if not."""
        with self._lock:
            window = self._pending.get(endpoint_id)
            if window is None or not window[0] <= message.seq <= window[1]:
                return False
            if message.seq == window[1]:
                del self._pending[endpoint_id]
            self._apply(endpoint_id, message.batch)
            return True

    def end_replay(self, endpoint_id: str) -> None:
        """The replay ended (or failed): stop waiting for the rest of the missed range."""
        with self._lock:
            self._pending.pop(endpoint_id, None)

    def apply_batch(self, endpoint_id: str, batch: DecodedBatch) -> None:
        """Apply a batch without sequence tracking (tests, in-process engines)."""
        with self._lock:
            self._apply(endpoint_id, batch)

    def remove_endpoint(self, endpoint_id: str) -> None:
        """Forget everything about an endpoint that left: blocks, sequence, problems."""
        with self._lock:
            self._blocks.release(endpoint_id)
            for table in (self._last_seq, self._pending, self._stored_events, self._problems):
                table.pop(endpoint_id, None)
            self._verified.discard(endpoint_id)

    # --- reading ------------------------------------------------------------------------------

    def match(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        """Consecutive blocks from the first key that each endpoint holds (0 when none)."""
        with self._lock:
            return self._blocks.match(endpoint_ids, keys)

    def host_blocks(self, endpoint_ids: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        """Of each endpoint's `match`, the blocks after its device-resident run (held in a host
        tier only: the engine reloads them); 0 when it never reported a host tier."""
        with self._lock:
            ids = list(endpoint_ids)
            if not self._host_bits:
                return dict.fromkeys(ids, 0)
            matched = self._blocks.match(ids, keys)
            device = ~self._host_bits
            out: dict[str, int] = {}
            for endpoint_id in ids:
                total = matched.get(endpoint_id, 0)
                run = 0
                while run < total and self._blocks.tiers(endpoint_id, keys[run]) & device:
                    run += 1
                out[endpoint_id] = total - run
            return out

    def blocks_of(self, endpoint_id: str) -> int:
        with self._lock:
            return self._blocks.count(endpoint_id)

    def pending_replay(self, endpoint_id: str) -> tuple[int, int] | None:
        with self._lock:
            return self._pending.get(endpoint_id)

    def stats(self) -> IndexStats:
        with self._lock:
            return IndexStats(
                entries=len(self._blocks),
                max_entries=self.max_entries,
                endpoints=self._blocks.endpoints,
                evictions=self._blocks.evictions,
                stored=self._stored,
                removed=self._removed,
                clears=self._clears,
                gaps=self._gaps,
                restarts=self._restarts,
                hash_problems=MappingProxyType(dict(self._problems)),
            )

    # --- internals (lock held) ----------------------------------------------------------------

    def _check_seq(self, endpoint_id: str, seq: int) -> SeqCheck:
        last = self._last_seq.get(endpoint_id)
        self._last_seq[endpoint_id] = seq
        if last is not None and seq == last + 1:
            return SeqCheck("in_order")
        if last is None:
            status: SeqStatus = "first" if seq == 0 else "gap"
            lo = 0
        elif seq > last + 1:
            status, lo = "gap", last + 1
        else:  # went back: the publisher restarted with an empty cache
            self._restarts += 1
            self._blocks.drop(endpoint_id)
            self._pending.pop(endpoint_id, None)
            status, lo = "restart", 0
        if seq <= lo:
            return SeqCheck(status)
        self._gaps += status == "gap"
        old = self._pending.get(endpoint_id)
        window = (lo if old is None else min(lo, old[0]), seq - 1)
        self._pending[endpoint_id] = window
        return SeqCheck(status, window[0], window[1])

    def _apply(self, endpoint_id: str, batch: DecodedBatch) -> None:
        rank = batch.dp_rank or 0
        for event in batch.events:
            self._apply_event(endpoint_id, event, rank)

    def _apply_event(self, endpoint_id: str, event: KVEvent, rank: int) -> None:
        if isinstance(event, AllBlocksCleared):
            self._clears += 1
            self._blocks.drop(endpoint_id)
            return
        bit = self._tier_bit(event.medium or MEDIUM_GPU, rank, event.group_idx or 0)
        if isinstance(event, BlockStored):
            if not self._accepts(endpoint_id, event):
                return
            for block_hash in event.block_hashes:
                self._blocks.store(endpoint_id, index_key(block_hash), bit)
            self._stored += len(event.block_hashes)
            return
        for block_hash in event.block_hashes:
            self._removed += self._blocks.unstore(endpoint_id, index_key(block_hash), bit)

    def _accepts(self, endpoint_id: str, event: BlockStored) -> bool:
        """Check the hashes of some events; store nothing from an endpoint that cannot match.

        Checked: every event until one passes, every event while the endpoint is flagged, then
        one in `verify_every`. A wrong block size is seen in every event that carries tokens (a
        host tier's stores carry none, and vLLM's may say block size 0).
        """
        if self._hasher is None:
            return True
        if not event.token_ids:  # a host tier's store (vLLM's CPU offload): no tokens to check
            return endpoint_id not in self._problems
        seen = self._stored_events.get(endpoint_id, 0)
        self._stored_events[endpoint_id] = seen + 1
        flagged = endpoint_id in self._problems
        due = flagged or endpoint_id not in self._verified or seen % self._verify_every == 0
        if event.block_size == self._hasher.block_size and not (checkable(event) and due):
            return not flagged
        problem = hash_problem(event, self._hasher)
        if problem is not None:
            self._problems[endpoint_id] = problem
            self._verified.discard(endpoint_id)
            return False
        if checkable(event):
            self._problems.pop(endpoint_id, None)
            self._verified.add(endpoint_id)
            return True
        return not flagged

    def _tier_bit(self, medium: str, rank: int, group: int) -> int:
        tier = (medium, rank, group)
        index = self._tiers.get(tier)
        if index is None:
            index = min(len(self._tiers), _MAX_TIER_BITS)
            if len(self._tiers) < _MAX_TIER_BITS:
                self._tiers[tier] = index
            if medium != MEDIUM_GPU:
                self._host_bits |= 1 << index
        return 1 << index
