"""The one bridge from the engine thread's `on_output` callbacks to an asyncio consumer.

Owns the per-request bounded queue, the mailbox that hands every output a step produced to the
event loop in one wake-up, and abort-on-leave; never blocks the engine thread or the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
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


class Mailbox:
    """Outputs posted from the engine thread, delivered on one event loop in batches: the first
    post after a delivery schedules one (one wake-up of the loop), later posts ride along. A
    step's outputs for 16 requests wake the loop once, not 16 times."""

    def __init__(self, event_loop: asyncio.AbstractEventLoop) -> None:
        self.event_loop = event_loop
        self._items: deque[tuple[OutputStream, RequestOutput]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, stream: OutputStream, out: RequestOutput) -> None:
        """Called from the engine thread; never blocks it (beyond a short lock)."""
        with self._lock:
            self._items.append((stream, out))
            if self._scheduled:
                return
            self._scheduled = True
        # A closed event loop means the server is gone and nobody is listening.
        with contextlib.suppress(RuntimeError):
            self.event_loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, deque()
            self._scheduled = False
        for stream, out in items:
            stream.put(out)


class OutputStream:
    """Outputs of one request, in order, delivered on the event loop of its mailbox."""

    def __init__(
        self, event_loop: asyncio.AbstractEventLoop, request_id: str, bound: int,
        mailbox: Mailbox | None = None,
    ) -> None:  # fmt: skip
        self.request_id = request_id
        self.finished = False
        self._mailbox = mailbox if mailbox is not None else Mailbox(event_loop)
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue(maxsize=bound)
        self._overflowed = False

    def push(self, out: RequestOutput) -> None:
        """Called from the engine thread; never blocks it."""
        self._mailbox.post(self, out)

    def put(self, out: RequestOutput) -> None:
        """On the event loop: queue one output."""
        try:
            self._queue.put_nowait(out)
        except asyncio.QueueFull:
            self._overflowed = True
            logger.error("output queue full", extra={"request_id": self.request_id})

    async def next(self, timeout: float) -> RequestOutput:
        """The next output; raises EngineStalledError when none comes within `timeout` s."""
        if self._overflowed:
            raise LoomError(f"request {self.request_id}: engine sent more outputs than tokens")
        if not self._queue.empty():  # delivered in a batch: no timer needed
            out = self._queue.get_nowait()
            self.finished = out.finished
            return out
        try:
            out = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise EngineStalledError(
                f"request {self.request_id}: no output from the engine in {timeout:g} s"
            ) from None
        self.finished = out.finished
        return out


@asynccontextmanager
async def submitted(
    sink: RequestSink, req: EngineRequest, mailbox: Mailbox | None = None
) -> AsyncIterator[OutputStream]:
    """Add `req` to the engine; abort it if the caller leaves (disconnect, error) before its end.
    `mailbox`: the server's, shared by its requests (None: one of its own).

    AdmissionError / InvalidRequestError from the engine propagate before anything is queued.
    """
    event_loop = asyncio.get_running_loop()
    if mailbox is not None and mailbox.event_loop is not event_loop:
        raise RuntimeError("the mailbox belongs to another event loop")
    stream = OutputStream(event_loop, req.request_id, req.sampling.max_tokens + _SLACK, mailbox)
    sink.add_request(req, stream.push)
    try:
        yield stream
    finally:
        if not stream.finished:
            logger.info("aborting request the client left", extra={"request_id": req.request_id})
            sink.abort(req.request_id)
