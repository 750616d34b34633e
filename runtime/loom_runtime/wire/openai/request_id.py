"""Request ids: which client `x-request-id` values are kept, and the ids the router and the
workers give a request.

Owns the id rules; never reads a header itself (the HTTP shells pass its value in).
"""

from __future__ import annotations

import uuid

MAX_CLIENT_ID = 128
"""The longest client id kept; a longer one (or one with unprintable characters) is replaced."""


def client_id(given: str) -> str | None:
    """The client's id if it is kept: non-empty, at most MAX_CLIENT_ID characters, printable."""
    if given and len(given) <= MAX_CLIENT_ID and given.isprintable():
        return given
    return None


def router_request_id(given: str) -> str:
    """The router's id for a request: the client's when kept (the router traces it as is)."""
    return client_id(given) or f"rtr-{uuid.uuid4().hex}"


def worker_request_id(given: str, prefix: str) -> str:
    """A worker's id, unique: a kept client id is embedded for tracing (never trusted unique)."""
    kept = client_id(given)
    if kept is not None:
        return f"{prefix}-{kept}-{uuid.uuid4().hex[:8]}"
    return f"{prefix}-{uuid.uuid4().hex}"
