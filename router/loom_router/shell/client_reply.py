"""The client's response to one request: prepared lazily (so its headers name the worker that
answered), an SSE stream once started, or a worker's whole answer passed through.

Owns the response headers and how an error reaches a client before and after the first byte;
never decides whether to retry (the attempt loop does).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from loom_router.core.endpoints import Endpoint
from loom_router.core.request import RequestFeatures
from loom_router.errors import RouterError, classify
from loom_router.shell.metrics import RouterMetrics
from loom_runtime.wire.headers import (
    ENDPOINT_HEADER,
    IGNORED_FIELDS_HEADER,
    REQUEST_ID_HEADER,
    WEIGHTS_HEADER,
)
from loom_runtime.wire.openai.response import ResponseKind
from loom_runtime.wire.openai.sse import encode


@dataclass(frozen=True)
class Trip:
    """One client request as the attempt loop needs it."""

    request_id: str
    kind: ResponseKind
    path: str
    body: Mapping[str, Any]
    headers_up: Mapping[str, str]
    headers_out: Mapping[str, str]
    started: float = field(default_factory=time.perf_counter)
    features: RequestFeatures | None = None
    """What the request was picked on (a migration re-picks on it, minus the failed workers)."""


class ClientReply:
    """The client's response: prepared lazily, SSE once started."""

    def __init__(self, request: web.Request, trip: Trip, metrics: RouterMetrics) -> None:
        self.request = request
        self.trip = trip
        self.metrics = metrics
        self.response: web.StreamResponse | None = None
        self.version: str | None = None
        self.headers: dict[str, str] = {REQUEST_ID_HEADER: trip.request_id, **trip.headers_out}

    @property
    def started(self) -> bool:
        return self.response is not None

    def upstream(self, endpoint: Endpoint, headers: Mapping[str, str]) -> None:
        if not self.started:
            self.version = headers.get(WEIGHTS_HEADER) or endpoint.weights_version
            self.headers[ENDPOINT_HEADER] = endpoint.id
            self.headers[WEIGHTS_HEADER] = self.version
            ignored = headers.get(IGNORED_FIELDS_HEADER)
            if ignored:  # the worker names request fields it ignored
                self.headers[IGNORED_FIELDS_HEADER] = ignored

    async def send(self, chunk: Mapping[str, Any] | str) -> None:
        await self._write(encode(dict(chunk) if not isinstance(chunk, str) else chunk))

    async def send_many(self, chunks: list[Mapping[str, Any]]) -> None:
        """Several chunks in one write (they arrived together)."""
        if chunks:
            await self._write(b"".join(encode(dict(c)) for c in chunks))

    async def _write(self, data: bytes) -> None:
        if self.response is None:
            self.metrics.ttft.observe(time.perf_counter() - self.trip.started)
            headers = {**self.headers, "Content-Type": "text/event-stream",
                       "Cache-Control": "no-cache"}  # fmt: skip
            self.response = web.StreamResponse(headers=headers)
            await self.response.prepare(self.request)
        await self.response.write(data)

    async def comment(self, text: str) -> None:
        if self.response is not None:
            await self.response.write(f": {text}\n\n".encode())

    async def finish(self) -> web.StreamResponse:
        await self.send("[DONE]")
        assert self.response is not None
        await self.response.write_eof()
        return self.response

    async def fail(self, exc: RouterError) -> web.StreamResponse:
        """Before the first chunk: raise (the error middleware answers); after: an SSE error."""
        if self.response is None:
            raise exc
        await self.send(classify(exc, self.trip.request_id).body())
        return await self.finish()

    async def passthrough(
        self, status: int, data: bytes, headers: Mapping[str, str]
    ) -> web.StreamResponse:
        """A worker's non-stream answer (a whole answer, or an error) with its status."""
        if self.response is not None:
            await self.send(_error_event(status, data))
            return await self.finish()
        kind = headers.get("content-type", "application/json")
        out = web.Response(status=status, body=data, headers=self.headers)
        out.content_type = kind.split(";")[0]
        return out


def _error_event(status: int, data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if isinstance(body, dict) and "error" in body:
        return body
    return {"error": {"message": f"worker answered {status}", "type": "server_error",
                      "param": None, "code": None}}  # fmt: skip
