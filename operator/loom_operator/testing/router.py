"""The command line of a `loom router` child process, for tests and benches.

Owns the flags every harness passes (config, ports, admin token); never starts or waits for the
process (the caller's spawner does).
"""

from __future__ import annotations

import sys
from pathlib import Path


def router_command(
    config: Path, port: int, admin_port: int, admin_token: str, *flags: str
) -> list[str]:
    """`python -m loom_router` serving `config` on 127.0.0.1:port (admin: admin_port)."""
    return [
        sys.executable, "-m", "loom_router", "--config", str(config),
        "--port", str(port), "--admin-port", str(admin_port), "--admin-token", admin_token,
        *flags,
    ]  # fmt: skip
