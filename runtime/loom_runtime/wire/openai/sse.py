"""Server-sent events as OpenAI streams write them: one `data:` line per event, `[DONE]` last.

Owns the framing of one event; never parses an event (the router's decoder does).
"""

from __future__ import annotations

import json
from typing import Any

DONE = "[DONE]"
"""The data of a stream's last event."""


def encode(data: dict[str, Any] | str) -> bytes:
    """One event: compact JSON (or a literal string such as DONE) after `data: `."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
