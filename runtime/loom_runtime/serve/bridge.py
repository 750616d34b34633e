"""The one bridge from the engine thread's `on_output` callbacks to an asyncio consumer.

Owns the per-request bounded queue and abort-on-leave; never blocks the engine thread or the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from loom_runtime.engine.types import EngineRequest, RequestOutput
from loom_runtime.errors import LoomError
from loom_runtime.serve.errors import EngineStalledError

logger = logging.getLogger(__name__)

# Outputs a request may produce beyond one per generated token (a final empty one, an abort).
_SLACK = 8


class RequestSink(Protocol):
    """The engine calls the server back through these (the Engine satisfies it)."""

    def add_request(
        self, req: EngineRequest, on_output: Callable[[RequestOutput], None]
    ) -> None: ...

    def abort(self, request_id: str) -> None: ...


class OutputStream:
    """Outputs of one request, in order, delivered on the event loop that created it."""

    def __init__(self, event_loop: asyncio.AbstractEventLoop, request_id: str, bound: int) -> None:
        self.request_id = request_id
        self.finished = False
        self._event_loop = event_loop
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue(maxsize=bound)
        self._overflowed = False

    def push(self, out: RequestOutput) -> None:
        """Called from the engine thread; never blocks it."""
        # A closed event loop means the server is gone and nobody is listening.
        with contextlib.suppress(RuntimeError):
            self._event_loop.call_soon_threadsafe(self._put, out)

    def _put(self, out: RequestOutput) -> None:
        try:
            self._queue.put_nowait(out)
        except asyncio.QueueFull:
            self._overflowed = True
            logger.error("output queue full", extra={"request_id": self.request_id})

    async def next(self, timeout: float) -> RequestOutput:
        """The next output; raises EngineStalledError when none comes within `timeout` s."""
        if self._overflowed:
            raise LoomError(f"request {self.request_id}: engine sent more outputs than tokens")
        try:
            out = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise EngineStalledError(
                f"request {self.request_id}: no output from the engine in {timeout:g} s"
            ) from None
        self.finished = out.finished
        return out


@asynccontextmanager
async def submitted(sink: RequestSink, req: EngineRequest) -> AsyncIterator[OutputStream]:
    """Add `req` to the engine; abort it if the caller leaves (disconnect, error) before its end.

    AdmissionError / InvalidRequestError from the engine propagate before anything is queued.
    """
    stream = OutputStream(
        asyncio.get_running_loop(), req.request_id, req.sampling.max_tokens + _SLACK
    )
    sink.add_request(req, stream.push)
    try:
        yield stream
    finally:
        if not stream.finished:
            logger.info("aborting request the client left", extra={"request_id": req.request_id})
            sink.abort(req.request_id)
