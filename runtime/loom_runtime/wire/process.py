"""How every Loom server process lives: its log lines (key=value extras after the message, on
stderr) and its lifetime (serve until SIGTERM or SIGINT, then stop gracefully).

Owns the log format and the signal handling the worker and the router share; never starts a
server itself and never imports anything heavier than the standard library.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Protocol

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ExtrasFormatter(logging.Formatter):
    """Appends `extra={...}` fields (request_id, endpoint, …) to each line as key=value."""

    _standard = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {k: v for k, v in record.__dict__.items() if k not in self._standard}
        return line + "".join(f" {k}={v}" for k, v in extras.items())


def configure_logging(level: int | str) -> None:
    """Log lines at `level` and above to stderr, extras appended."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ExtrasFormatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


class Servable(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def serve_until_signalled(
    server: Servable, logger: logging.Logger, stopping: str = "stopping"
) -> None:
    """Run `server` until SIGTERM or SIGINT, then stop it gracefully (`stopping` is logged)."""
    stop = asyncio.Event()
    event_loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        event_loop.add_signal_handler(sig, stop.set)
    await server.start()
    try:
        await stop.wait()
        logger.info(stopping)
    finally:
        await server.stop()
