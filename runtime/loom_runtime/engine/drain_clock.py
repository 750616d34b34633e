"""How long a worker took to drain: from admission closing to nothing left in flight and no KV
lease awaiting its pull (what a weight sync or a scale-down waits for).

Owns the drain counters; never reads a clock (time is an argument) and never closes admission.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DrainClock:
    """Closed at Pause, settled whenever the engine looks at itself, reopened at Resume."""

    closed_at: float | None = None
    """When admission closed; None while it is open or once this drain is counted."""
    drains: int = 0
    """Drains completed (counter)."""
    seconds: float = 0.0
    """Seconds all completed drains took (counter)."""
    last_seconds: float = 0.0
    """How long the latest completed drain took."""

    def close(self, now: float, already_closed: bool) -> None:
        """Admission closes (a second Pause of the same drain keeps the first time)."""
        if not already_closed:
            self.closed_at = now

    def reopen(self) -> None:
        """Admission reopens: a drain still running is abandoned, not counted."""
        self.closed_at = None

    def settle(self, now: float, idle: bool) -> None:
        """Count the drain once the worker is idle while closed."""
        if self.closed_at is None or not idle:
            return
        self.last_seconds = max(0.0, now - self.closed_at)
        self.seconds += self.last_seconds
        self.drains += 1
        self.closed_at = None
