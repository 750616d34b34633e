"""HTTP calls from the router to workers (aiohttp), with every failure turned into a typed error.

Owns the client session, timeouts and the mapping of aiohttp's exceptions: a connection the
worker refused (`UpstreamRefusedError`: mark it down), one that failed before an answer
(`UpstreamUnavailableError`: safe to send elsewhere), one that broke mid-answer
(`UpstreamBrokenError`: migrate). Never decides where to send, and never retries on its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from loom_router.core.endpoints import Endpoint
from loom_router.errors import (
    UpstreamBrokenError,
    UpstreamRefusedError,
    UpstreamUnavailableError,
)
from loom_router.shell.sse import SSEDecoder, SSEFormatError
from loom_runtime.wire.openai.sse import DONE

MAX_BODY_BYTES = 64 << 20


@dataclass(frozen=True)
class UpstreamTimeouts:
    connect_s: float = 5.0
    """Longest wait to connect (the card's failover.healthTimeoutSeconds)."""
    read_s: float = 300.0
    """Longest silence inside an answer (a token every few seconds is slow, not dead)."""


@dataclass(frozen=True)
class UpstreamReply:
    """A complete (non-streamed) answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class UpstreamStream:
    """An answer being streamed: status and headers now, events as they come."""

    def __init__(self, endpoint: Endpoint, response: aiohttp.ClientResponse) -> None:
        self.endpoint = endpoint
        self.status = response.status
        self.headers: Mapping[str, str] = {k.lower(): v for k, v in response.headers.items()}
        self._response = response

    def abort(self) -> None:
        """Close the connection now (the admin's migrate): the reader sees a broken stream."""
        self._response.close()

    @property
    def is_sse(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")

    async def read_all(self) -> bytes:
        """The whole answer (at most MAX_BODY_BYTES)."""
        parts: list[bytes] = []
        size = 0
        try:
            while chunk := await self._response.content.read(1 << 16):
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise UpstreamBrokenError(self.endpoint.id, "answer over 64 MiB")
                parts.append(chunk)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBrokenError(self.endpoint.id, f"answer broke: {_why(exc)}") from exc
        return b"".join(parts)

    async def raw(self) -> AsyncIterator[bytes]:
        """The answer's bytes as they arrive (a relay that passes them on as they are);
        UpstreamBrokenError if it breaks."""
        try:
            async for data in self._response.content.iter_any():
                yield data
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBrokenError(self.endpoint.id, f"stream broke: {_why(exc)}") from exc

    async def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The JSON events of each network read, in order (so a relay writes them at once);
        ends after [DONE]; UpstreamBrokenError if the stream breaks first."""
        decoder = SSEDecoder()
        eid = self.endpoint.id
        try:
            async for data in self._response.content.iter_any():
                batch: list[dict[str, Any]] = []
                for payload in decoder.feed(data):
                    if payload == DONE:
                        yield batch
                        return
                    try:
                        event = json.loads(payload)
                    except ValueError as exc:
                        raise UpstreamBrokenError(eid, "sent an event that is not JSON") from exc
                    if isinstance(event, dict):
                        batch.append(event)
                if batch:
                    yield batch
        except (aiohttp.ClientError, TimeoutError, SSEFormatError) as exc:
            raise UpstreamBrokenError(eid, f"stream broke: {_why(exc)}") from exc
        raise UpstreamBrokenError(eid, "stream ended without [DONE]")


class Upstream:
    """One pooled client session for all workers. Create and close it on the event loop."""

    def __init__(self, timeouts: UpstreamTimeouts, max_connections: int = 1024) -> None:
        self.timeouts = timeouts
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeouts.connect_s, sock_read=self.timeouts.read_s
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream.start() was not called")
        return self._session

    @asynccontextmanager
    async def stream(
        self,
        endpoint: Endpoint,
        path: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
    ) -> AsyncIterator[UpstreamStream]:
        """POST `body` to the endpoint; yields once its status and headers are in. Leaving the
        block closes the connection, which makes the worker abort the request."""
        try:
            cm = self.session.post(endpoint.url + path, json=body, headers=dict(headers))
            response = await cm.__aenter__()
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamRefusedError(endpoint.id, f"connection failed: {_why(exc)}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamUnavailableError(endpoint.id, f"no answer: {_why(exc)}") from exc
        try:
            yield UpstreamStream(endpoint, response)
        except BaseException:
            response.close()  # a failed or abandoned answer: drop the connection
            raise
        finally:
            await cm.__aexit__(None, None, None)  # back to the pool only if fully read

    async def post(
        self,
        endpoint: Endpoint,
        path: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        timeout_s: float | None = None,
    ) -> UpstreamReply:
        """POST and read the whole answer (bounded by `timeout_s` when given)."""

        async def call() -> UpstreamReply:
            async with self.stream(endpoint, path, body, headers) as up:
                data = await up.read_all()
                return UpstreamReply(up.status, up.headers, data)

        if timeout_s is None:
            return await call()
        try:
            return await asyncio.wait_for(call(), timeout_s)
        except TimeoutError as exc:
            raise UpstreamBrokenError(endpoint.id, f"no full answer in {timeout_s:g} s") from exc

    async def call(
        self, endpoint: Endpoint, method: str, path: str, timeout_s: float
    ) -> UpstreamReply:
        """A bodiless request (GET, DELETE) and its whole answer (at most MAX_BODY_BYTES)."""
        try:
            async with self.session.request(
                method, endpoint.url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                up = UpstreamStream(endpoint, resp)
                return UpstreamReply(up.status, up.headers, await up.read_all())
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamRefusedError(endpoint.id, f"connection failed: {_why(exc)}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamUnavailableError(endpoint.id, f"no answer: {_why(exc)}") from exc

    async def get(self, url: str, timeout_s: float) -> tuple[int, str]:
        """GET a small document (metrics, probes); raises the errors above with id = url."""
        try:
            async with self.session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return resp.status, await resp.text()
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamRefusedError(url, _why(exc)) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamUnavailableError(url, _why(exc) or "timed out") from exc


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
