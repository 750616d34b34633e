"""Leases on a prefill worker's KV blocks: held until a decode pulled them, or until they expire.

Owns the lease records and their deadlines (thread-safe: side-channel and NIXL progress threads
complete and pin leases, the engine grants and reaps them); never frees a block itself: the
engine frees what `take_released` hands back, on its own thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Lease:
    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int
    deadline: float  # clock() value after which the blocks are taken back
    readers: int = 0  # side-channel reads in progress: the lease cannot expire under them
    pulled: bool = False


@dataclass(frozen=True)
class Released:
    """Blocks the engine may free now: pulled (the decode said so) or expired."""

    request_id: str
    block_ids: tuple[int, ...]
    expired: bool


@dataclass
class LeaseTable:
    """Every live lease of one prefill worker. The pool bounds their number (each holds blocks);
    `ttl_s` bounds their life."""

    ttl_s: float
    clock: Callable[[], float] = time.monotonic
    _leases: dict[str, Lease] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.ttl_s <= 0:
            raise ValueError(f"lease ttl must be > 0 s, got {self.ttl_s}")

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def grant(self, request_id: str, block_ids: Sequence[int], num_tokens: int) -> Lease:
        with self._lock:
            if request_id in self._leases:
                raise ValueError(f"request {request_id!r} already holds a KV lease")
            lease = Lease(request_id, tuple(block_ids), num_tokens, self.clock() + self.ttl_s)
            self._leases[request_id] = lease
            return lease

    def pin(self, request_id: str) -> Lease | None:
        """Extend a live lease to a full ttl from now (a decode's heartbeat before it reads);
        None when the lease is gone (pulled, expired or never granted)."""
        with self._lock:
            lease = self._live(request_id)
            if lease is not None:
                lease.deadline = max(lease.deadline, self.clock() + self.ttl_s)
            return lease

    def begin_read(self, request_id: str) -> Lease | None:
        """Pin the lease for a side-channel read; pair with `end_read`. None if gone."""
        with self._lock:
            lease = self._live(request_id)
            if lease is not None:
                lease.readers += 1
            return lease

    def end_read(self, request_id: str, pulled: bool) -> None:
        with self._lock:
            lease = self._leases.get(request_id)
            if lease is not None:
                lease.readers -= 1
                lease.pulled = lease.pulled or pulled
                lease.deadline = max(lease.deadline, self.clock() + self.ttl_s)

    def complete(self, request_id: str) -> bool:
        """The decode has the KV (or no longer wants it): release at the next reap."""
        with self._lock:
            lease = self._leases.get(request_id)
            if lease is None:
                return False
            lease.pulled = True
            return True

    def take_released(self) -> list[Released]:
        """Remove and return the leases whose blocks can be freed now."""
        now = self.clock()
        out: list[Released] = []
        with self._lock:
            for rid, lease in list(self._leases.items()):
                if lease.readers:
                    continue
                if lease.pulled or now >= lease.deadline:
                    del self._leases[rid]
                    out.append(Released(rid, lease.block_ids, expired=not lease.pulled))
        return out

    def _live(self, request_id: str) -> Lease | None:
        lease = self._leases.get(request_id)
        if lease is None or lease.pulled or (not lease.readers and self.clock() >= lease.deadline):
            return None
        return lease
