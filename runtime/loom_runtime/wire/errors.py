"""The one error of the wire contracts: a setting both sides must agree on is out of range.

Owns the type only; raising sites say what was wrong and what to do.
"""

from __future__ import annotations

from loom_runtime.errors import LoomError


class WireConfigError(LoomError, ValueError):
    """A hashing or event-encoding setting is out of range or unknown."""
