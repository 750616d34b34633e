"""Free TCP ports on 127.0.0.1 for local workers and the router.

Owns picking ports the OS says are free and that this fleet has not handed out; never binds
them for longer than the check (the process that serves on a port binds it itself).
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from contextlib import ExitStack

HOST = "127.0.0.1"
MAX_TRIES = 64


class PortError(RuntimeError):
    """No free port could be found, or a port the user asked for is taken."""


def free_ports(n: int, avoid: Collection[int] = (), host: str = HOST) -> list[int]:
    """`n` distinct ports that were free a moment ago on `host`, none of them in `avoid`.

    All `n` sockets are held open together while picking, so the OS never hands one out twice.
    """
    picked: list[int] = []
    with ExitStack() as stack:
        for _ in range(n * MAX_TRIES):
            if len(picked) == n:
                break
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            port = int(s.getsockname()[1])
            if port not in avoid and port not in picked:
                picked.append(port)
    if len(picked) < n:
        raise PortError(f"found only {len(picked)} of {n} free ports on {host}")
    return picked


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when nothing listens on `host:port` and it can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
