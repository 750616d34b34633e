"""The errors a weight push raises: refused before any byte moved, or failed while moving.

Owns what each error carries (which workers, which names); never retries.
"""

from __future__ import annotations


class PushError(Exception):
    """A weight push did not become the fleet's version; the fleet serves what it served."""


class PushRefused(PushError):
    """Refused before any byte moved: another push is open, a worker is not ready, or the
    pushed names, shapes or dtypes do not fit a worker's model (`problems`, by worker)."""

    def __init__(self, message: str, problems: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or {}


class PushFailed(PushError):
    """Started but not completed: a collective timed out, a checksum differed or a worker died
    (the fleet serves what it served before), or the swap did not finish in time (every worker
    serves one complete version, old or new; never a half-received one)."""
