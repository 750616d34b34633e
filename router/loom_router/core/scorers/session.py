"""Session affinity: requests with the same session header go where the session went last.

Owns the bounded session table and the scorer (1 for that endpoint, 0 elsewhere); never keeps
a session on an endpoint the filters dropped (it is simply not a candidate).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from loom_router.core.scorers.contract import ScoringContext
from loom_router.errors import ConfigError

MAX_TOKEN_CHARS = 256
"""Longer session tokens are ignored (no affinity), so one client cannot bloat the table."""


def score(ctx: ScoringContext) -> dict[str, float]:
    return {c: 1.0 if c == ctx.session_endpoint else 0.0 for c in ctx.candidates}


class SessionTable:
    """session token → endpoint id, an LRU of at most `max_sessions`. Thread-safe (one lock)."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        if max_sessions <= 0:
            raise ConfigError(f"max_sessions must be positive, got {max_sessions}")
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._evictions = 0

    def lookup(self, token: str | None) -> str | None:
        if not token:
            return None
        with self._lock:
            return self._sessions.get(token)

    def record(self, token: str | None, endpoint_id: str) -> None:
        """The session's request went to `endpoint_id`; the oldest session goes when full."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return
        with self._lock:
            self._sessions[token] = endpoint_id
            self._sessions.move_to_end(token)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
                self._evictions += 1

    def forget_endpoint(self, endpoint_id: str) -> int:
        """Drop the sessions pinned to an endpoint that left; returns how many."""
        with self._lock:
            gone = [t for t, e in self._sessions.items() if e == endpoint_id]
            for token in gone:
                del self._sessions[token]
            return len(gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    @property
    def evictions(self) -> int:
        with self._lock:
            return self._evictions
