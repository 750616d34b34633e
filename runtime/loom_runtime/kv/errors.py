"""Typed errors of KV block accounting, prefix hashing and KV events.

Owns the error types only; raising sites say what was wrong and what to do, nothing maps them here.
"""

from __future__ import annotations

from loom_runtime.errors import AdmissionError, LoomError
from loom_runtime.wire.errors import WireConfigError


class KVConfigError(WireConfigError):
    """A KV setting is out of range or unknown (block size, hash algorithm, event layout)."""


class OutOfBlocksError(AdmissionError):
    """The pool cannot hand out the blocks asked for, even after evicting every cached block."""

    def __init__(self, requested: int, available: int) -> None:
        super().__init__(
            f"asked for {requested} KV blocks but only {available} can be freed; "
            "admit fewer tokens or wait for running requests to finish"
        )
        self.requested = requested
        self.available = available


class BlockStateError(LoomError, RuntimeError):
    """A caller used a block in a state that forbids it (a bug in the caller, never user input)."""
