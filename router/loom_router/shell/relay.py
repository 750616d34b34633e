"""Relays a worker's answer to the client, and moves the request to another worker when the
first one dies, breaks its stream, is paused, or an admin migrates it away.

Owns the attempt loop (bounded by failover.migrationLimit), the client's response (prepared at
the first chunk, so headers name the worker that answered) and the registry of in-flight
upstream calls; never picks endpoints itself (the dispatcher does) and never rewrites chunks
(migration.StreamTracker does).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from loom_router.core.endpoints import Endpoint
from loom_router.core.load import LoadTracker
from loom_router.core.migration import Attempt, Kind, StreamTracker, first_attempt
from loom_router.core.request import RequestFeatures
from loom_router.errors import (
    MigrationFailedError,
    NoEndpointError,
    RouterError,
    UpstreamError,
    UpstreamRefusedError,
    classify,
)
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.prober import Prober
from loom_router.shell.sse import encode
from loom_router.shell.upstream import Upstream, UpstreamStream
from loom_runtime.wire.headers import (
    ENDPOINT_HEADER,
    MIGRATED_HEADER,
    REQUEST_ID_HEADER,
    WEIGHTS_HEADER,
)
from loom_runtime.wire.pd import decode_body

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({502, 503, 504})
"""Answers that mean "not here, not now" (paused, draining, stalled): try another worker."""
_MOVABLE_CODES = frozenset({"request_aborted", "engine_stalled", "admission_closed"})


@dataclass(frozen=True)
class Trip:
    """One client request as the relay needs it."""

    request_id: str
    kind: Kind
    path: str
    body: Mapping[str, Any]
    headers_up: Mapping[str, str]
    headers_out: Mapping[str, str]
    started: float = field(default_factory=time.perf_counter)
    features: RequestFeatures | None = None
    """What the request was picked on (a migration re-picks on it, minus the failed workers)."""


class Repicker(Protocol):
    def repick(self, trip: Trip, exclude: set[str], version: str | None) -> Endpoint: ...

    async def max_model_len(self, endpoint: Endpoint) -> int | None: ...


class Flight:
    """One upstream call in progress; `move()` (admin migrate) breaks it so it moves on."""

    def __init__(self, endpoint_id: str) -> None:
        self.endpoint_id = endpoint_id
        self.moved = False
        self.stream: UpstreamStream | None = None

    def move(self) -> None:
        self.moved = True
        if self.stream is not None:
            self.stream.abort()


class Flights:
    """In-flight upstream calls per endpoint (bounded by the requests in flight)."""

    def __init__(self) -> None:
        self._by_endpoint: dict[str, set[Flight]] = {}

    def add(self, endpoint_id: str) -> Flight:
        flight = Flight(endpoint_id)
        self._by_endpoint.setdefault(endpoint_id, set()).add(flight)
        return flight

    def remove(self, flight: Flight) -> None:
        group = self._by_endpoint.get(flight.endpoint_id)
        if group is not None:
            group.discard(flight)
            if not group:
                del self._by_endpoint[flight.endpoint_id]

    def count(self, endpoint_id: str) -> int:
        return len(self._by_endpoint.get(endpoint_id, ()))

    def migrate(self, endpoint_id: str) -> int:
        """Move every request in flight on the endpoint elsewhere; returns how many."""
        flights = list(self._by_endpoint.get(endpoint_id, ()))
        for flight in flights:
            flight.move()
        return len(flights)


class _Move(Exception):
    """This attempt failed in a way another worker can make good."""


class _Client:
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
        """A worker's non-stream answer (an error, mostly) with its status."""
        if self.response is not None:
            await self.send(_error_event(status, data))
            return await self.finish()
        kind = headers.get("content-type", "application/json")
        out = web.Response(status=status, body=data, headers=self.headers)
        out.content_type = kind.split(";")[0]
        return out


class Relay:
    def __init__(
        self,
        upstream: Upstream,
        prober: Prober,
        metrics: RouterMetrics,
        load: LoadTracker,
        repicker: Repicker,
        migration_limit: int,
    ) -> None:
        self.upstream = upstream
        self.prober = prober
        self.metrics = metrics
        self.load = load
        self.repicker = repicker
        self.migration_limit = migration_limit
        self.flights = Flights()

    # --- streamed ------------------------------------------------------------------------------

    async def stream(
        self, request: web.Request, trip: Trip, endpoint: Endpoint, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        client = _Client(request, trip, self.metrics)
        tracker = StreamTracker(trip.kind, trip.body)
        attempt = first_attempt(trip.path, body, trip.kind)
        exclude: set[str] = set()
        moves = 0
        while True:
            tracker.begin(attempt)
            try:
                return await self._stream_once(endpoint, attempt, tracker, client)
            except _Move as move:
                moves += 1
                exclude.add(endpoint.id)
                if tracker.finished and client.started:
                    return await client.finish()  # only [DONE] was missing
                try:
                    new = self._replacement(trip, client, tracker, endpoint, move, moves, exclude)
                except MigrationFailedError as exc:
                    return await client.fail(exc)
                max_len = None
                if trip.kind == "chat" and tracker.prompt_ids is not None:
                    max_len = await self.repicker.max_model_len(new)
                attempt = tracker.replay(trip.path, decode_body(trip.body, None), max_len)
                outcome = "resumed" if attempt.token_base else "restarted"
                self.metrics.inc("migrations", outcome)
                sent = len(tracker.tokens)
                logger.warning("migrating a stream", extra={
                    "request_id": trip.request_id, "from_endpoint": endpoint.id,
                    "to_endpoint": new.id, "why": str(move), "outcome": outcome,
                    "resume_at": attempt.token_base, "tokens_sent": sent})  # fmt: skip
                await client.comment(f"loom-migrated from={endpoint.id} to={new.id} tokens={sent}")
                if not client.started:
                    client.headers[MIGRATED_HEADER] = _migrated(endpoint, new, str(move))
                endpoint = new

    def _replacement(
        self,
        trip: Trip,
        client: _Client,
        tracker: StreamTracker,
        failed: Endpoint,
        move: _Move,
        moves: int,
        exclude: set[str],
    ) -> Endpoint:
        """Where the stream continues; MigrationFailedError when nowhere. Once the client has
        output of one weights version, only that version may continue it (DESIGN.md invariant 5)."""
        why = f"worker {failed.id} failed ({move}) after {len(tracker.tokens)} tokens"
        if moves > self.migration_limit:
            self.metrics.inc("migrations", "exhausted")
            limit = f"failover.migrationLimit {self.migration_limit} reached"
            raise MigrationFailedError(f"{why}; {limit}")
        version = client.version if client.started else None
        try:
            return self.repicker.repick(trip, exclude, version)
        except NoEndpointError as exc:
            self.metrics.inc("migrations", "no_endpoint")
            raise MigrationFailedError(f"{why}; no worker can continue it: {exc}") from exc

    async def _stream_once(
        self,
        endpoint: Endpoint,
        attempt: Attempt,
        tracker: StreamTracker,
        client: _Client,
    ) -> web.StreamResponse:
        headers = client.trip.headers_up
        async with (
            self._attempt(endpoint) as flight,
            self.upstream.stream(endpoint, attempt.path, attempt.body, headers) as up,
        ):
            flight.stream = up
            if flight.moved:
                raise _Move("moved by an admin")
            if up.status != 200 or not up.is_sse:
                data = await up.read_all()
                if up.status in RETRY_STATUSES:
                    raise _Move(f"answered {up.status}")
                return await client.passthrough(up.status, data, up.headers)
            client.upstream(endpoint, up.headers)
            async for batch in up.batches():
                out: list[Mapping[str, Any]] = []
                for event in batch:
                    if "error" in event:
                        await client.send_many(out)  # the tracker counts them as sent
                        if _movable(event):
                            raise _Move(f"error event {event['error'].get('code')}")
                        await client.send(event)
                        return await client.finish()
                    chunk = tracker.take(event)
                    if chunk is not None:
                        out.append(chunk)
                await client.send_many(out)
            if tracker.diverged:
                logger.warning("a resumed stream regenerated other tokens (not greedy?)",
                               extra={"request_id": client.trip.request_id})  # fmt: skip
            return await client.finish()

    # --- not streamed --------------------------------------------------------------------------

    async def once(
        self, request: web.Request, trip: Trip, endpoint: Endpoint, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        """A non-streamed request: nothing reached the client before the end, so a failed
        attempt is simply sent again from the prompt (any weights version may take it)."""
        client = _Client(request, trip, self.metrics)
        exclude: set[str] = set()
        moves = 0
        while True:
            try:
                status, data, headers = await self._post_once(endpoint, body, trip)
            except _Move as move:
                failure = str(move)
            else:
                if status not in RETRY_STATUSES or moves >= self.migration_limit:
                    self.metrics.ttft.observe(time.perf_counter() - trip.started)
                    client.upstream(endpoint, headers)
                    return await client.passthrough(status, data, headers)
                failure = f"answered {status}"
            moves += 1
            exclude.add(endpoint.id)
            why = f"worker {endpoint.id} failed ({failure})"
            if moves > self.migration_limit:
                self.metrics.inc("migrations", "exhausted")
                raise MigrationFailedError(
                    f"{why}; failover.migrationLimit {self.migration_limit} reached"
                )
            try:
                new = self.repicker.repick(trip, exclude, None)
            except NoEndpointError as exc:
                self.metrics.inc("migrations", "no_endpoint")
                raise MigrationFailedError(f"{why}; {exc}") from exc
            self.metrics.inc("migrations", "restarted")
            logger.warning("retrying a request elsewhere", extra={
                "request_id": trip.request_id, "from": endpoint.id, "to": new.id,
                "why": failure})  # fmt: skip
            client.headers[MIGRATED_HEADER] = _migrated(endpoint, new, failure)
            endpoint, body = new, decode_body(trip.body, None)

    async def _post_once(
        self, endpoint: Endpoint, body: Mapping[str, Any], trip: Trip
    ) -> tuple[int, bytes, Mapping[str, str]]:
        async with (
            self._attempt(endpoint) as flight,
            self.upstream.stream(endpoint, trip.path, body, trip.headers_up) as up,
        ):
            flight.stream = up
            if flight.moved:
                raise _Move("moved by an admin")
            return up.status, await up.read_all(), up.headers

    @asynccontextmanager
    async def _attempt(self, endpoint: Endpoint) -> AsyncIterator[Flight]:
        """One try on one endpoint, counted in flight and in its load while it lasts. A refused
        connection marks the endpoint down, a broken one makes it suspect (unless an admin moved
        the request away); both become _Move."""
        flight = self.flights.add(endpoint.id)
        self.load.begin(endpoint.id)
        try:
            yield flight
        except UpstreamRefusedError as exc:
            self._count(endpoint.id, "refused")
            self.prober.refused(endpoint.id, str(exc))
            raise _Move(str(exc)) from exc
        except UpstreamError as exc:
            self._count(endpoint.id, "broken")
            if not flight.moved:
                self.prober.suspect(endpoint.id)
            raise _Move("moved by an admin" if flight.moved else str(exc)) from exc
        finally:
            self.load.end(endpoint.id)
            self.flights.remove(flight)

    def _count(self, endpoint_id: str, kind: str) -> None:
        self.metrics.inc("upstream_errors", endpoint_id, kind)


def _migrated(failed: Endpoint, new: Endpoint, why: str) -> str:
    """The x-loom-migrated header: where the request failed, and a version change if any (it
    was restarted from its prompt: nothing of the old version reached the client)."""
    text = f"from {failed.id}: {why}"
    if new.weights_version != failed.weights_version:
        text += f"; restarted from the prompt on weights version {new.weights_version}"
    return text[:512]


def _movable(event: Mapping[str, Any]) -> bool:
    error = event.get("error")
    return isinstance(error, Mapping) and error.get("code") in _MOVABLE_CODES


def _error_event(status: int, data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if isinstance(body, dict) and "error" in body:
        return body
    return {"error": {"message": f"worker answered {status}", "type": "server_error",
                      "param": None, "code": None}}  # fmt: skip
