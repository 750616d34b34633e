"""THE attempt loop: one client request sent to a worker, and moved to another when the worker
dies, breaks its answer, is paused, or an admin migrates it away; streamed and whole answers
alike (a stream of several choices only until its first chunk), bounded by
failover.migrationLimit.

Owns retry and migration: when to move, where to (a re-pick without the failed workers, on the
weights version the client already has), and what the client hears about it; never opens a
connection itself (transport.py does, and raises AttemptFailed) and never rewrites a chunk
(core.migration.StreamTracker does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web

from loom_router.core.endpoints import Endpoint
from loom_router.core.migration import Attempt, StreamTracker, first_attempt
from loom_router.core.request import RequestFeatures
from loom_router.errors import MigrationFailedError, NoEndpointError
from loom_router.shell.client_reply import ClientReply, Trip
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.picking import Picking
from loom_router.shell.transport import AttemptFailed, Transport
from loom_runtime.wire.headers import MIGRATED_HEADER
from loom_runtime.wire.pd import decode_body, several_choices

logger = logging.getLogger(__name__)

_MOVABLE_CODES = frozenset({"request_aborted", "engine_stalled", "admission_closed"})


class Course(Protocol):
    """How one request's attempts go: streamed (resumed exactly) or whole (sent again)."""

    client: ClientReply

    async def attempt(self, transport: Transport, endpoint: Endpoint) -> web.StreamResponse:
        """One try on `endpoint`; AttemptFailed when another worker should try."""
        ...

    async def salvage(self) -> web.StreamResponse | None:
        """The answer when a failed attempt in fact gave the client everything."""
        ...

    def progress(self) -> str:
        """What the client has so far, for error messages."""
        ...

    async def move(self, failed: Endpoint, new: Endpoint, picking: Picking) -> str:
        """Prepare the next attempt on `new`; the migrations metric's outcome label."""
        ...


class AttemptLoop:
    def __init__(
        self,
        transport: Transport,
        picking: Picking,
        metrics: RouterMetrics,
        migration_limit: int,
    ) -> None:
        self.transport = transport
        self.picking = picking
        self.metrics = metrics
        self.migration_limit = migration_limit

    async def run(
        self, request: web.Request, trip: Trip, endpoint: Endpoint, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        """The client's response for `trip`, first sent to `endpoint` with `body`."""
        client = ClientReply(request, trip, self.metrics)
        course: Course
        if trip.body.get("stream") is not True:
            course = Whole(trip, client, body)
        elif several_choices(trip.body):
            course = Relayed(trip, client, body)
        else:
            course = Streamed(trip, client, body)
        exclude: set[str] = set()
        moves = 0
        while True:
            try:
                return await course.attempt(self.transport, endpoint)
            except AttemptFailed as failure:
                moves += 1
                exclude.add(endpoint.id)
                done = await course.salvage()
                if done is not None:
                    return done
                try:
                    new = self._replacement(trip, client, course, endpoint, failure, moves, exclude)
                    outcome = await course.move(endpoint, new, self.picking)
                except MigrationFailedError as exc:
                    return await client.fail(exc)
                self.metrics.inc("migrations", outcome)
                logger.warning("migrating a request", extra={
                    "request_id": trip.request_id, "from_endpoint": endpoint.id,
                    "to_endpoint": new.id, "why": str(failure), "outcome": outcome,
                    "progress": course.progress()})  # fmt: skip
                if not client.started:
                    client.headers[MIGRATED_HEADER] = _migrated(endpoint, new, str(failure))
                endpoint = new

    def _replacement(
        self,
        trip: Trip,
        client: ClientReply,
        course: Course,
        failed: Endpoint,
        failure: AttemptFailed,
        moves: int,
        exclude: set[str],
    ) -> Endpoint:
        """Where the request continues; MigrationFailedError when nowhere. Once the client has
        output of one weights version, only that version may continue it (DESIGN.md invariant 5)."""
        why = f"worker {failed.id} failed ({failure}){course.progress()}"
        if moves > self.migration_limit:
            self.metrics.inc("migrations", "exhausted")
            limit = f"failover.migrationLimit {self.migration_limit} reached"
            raise MigrationFailedError(f"{why}; {limit}")
        version = client.version if client.started else None
        features = trip.features or RequestFeatures(trip.request_id, 0)
        try:
            return self.picking.repick(features, exclude, version)
        except NoEndpointError as exc:
            self.metrics.inc("migrations", "no_endpoint")
            raise MigrationFailedError(f"{why}; no worker can continue it: {exc}") from exc


class Streamed:
    """A streamed request: a replacement resumes where the client's stream stands."""

    def __init__(self, trip: Trip, client: ClientReply, body: Mapping[str, Any]) -> None:
        self.trip = trip
        self.client = client
        self.tracker = StreamTracker(trip.kind, trip.body)
        self.next: Attempt = first_attempt(trip.path, body, trip.kind)

    async def attempt(self, transport: Transport, endpoint: Endpoint) -> web.StreamResponse:
        tracker, client, attempt = self.tracker, self.client, self.next
        tracker.begin(attempt)
        async with transport.attempt(
            endpoint, attempt.path, attempt.body, self.trip.headers_up
        ) as up:
            if up.status != 200 or not up.is_sse:
                return await client.passthrough(up.status, await up.read_all(), up.headers)
            client.upstream(endpoint, up.headers)
            async for batch in up.batches():
                out: list[Mapping[str, Any]] = []
                for event in batch:
                    if "error" in event:
                        await client.send_many(out)  # the tracker counts them as sent
                        if _movable(event):
                            raise AttemptFailed(f"error event {event['error'].get('code')}")
                        await client.send(event)
                        return await client.finish()
                    chunk = tracker.take(event)
                    if chunk is not None:
                        out.append(chunk)
                await client.send_many(out)
            if tracker.diverged:
                logger.warning("a resumed stream regenerated other tokens (not greedy?)",
                               extra={"request_id": self.trip.request_id})  # fmt: skip
            return await client.finish()

    async def salvage(self) -> web.StreamResponse | None:
        if self.tracker.finished and self.client.started:
            return await self.client.finish()  # only [DONE] was missing
        return None

    def progress(self) -> str:
        return f" after {len(self.tracker.tokens)} tokens"

    async def move(self, failed: Endpoint, new: Endpoint, picking: Picking) -> str:
        max_len = None
        if self.trip.kind == "chat" and self.tracker.prompt_ids is not None:
            max_len = await picking.max_model_len(new)
        self.next = self.tracker.replay(self.trip.path, decode_body(self.trip.body, None), max_len)
        sent = len(self.tracker.tokens)
        await self.client.comment(f"loom-migrated from={failed.id} to={new.id} tokens={sent}")
        return "resumed" if self.next.token_base else "restarted"


class Whole:
    """A non-streamed request: nothing reached the client before the end, so a failed attempt is
    simply sent again from the prompt (any weights version may take it)."""

    def __init__(self, trip: Trip, client: ClientReply, body: Mapping[str, Any]) -> None:
        self.trip = trip
        self.client = client
        self.body = body

    async def attempt(self, transport: Transport, endpoint: Endpoint) -> web.StreamResponse:
        trip = self.trip
        async with transport.attempt(endpoint, trip.path, self.body, trip.headers_up) as up:
            data = await up.read_all()
        self.client.metrics.ttft.observe(time.perf_counter() - trip.started)
        self.client.upstream(endpoint, up.headers)
        return await self.client.passthrough(up.status, data, up.headers)

    async def salvage(self) -> web.StreamResponse | None:
        return None

    def progress(self) -> str:
        return ""

    async def move(self, failed: Endpoint, new: Endpoint, picking: Picking) -> str:
        self.body = decode_body(self.trip.body, None)
        return "restarted"


class Relayed:
    """A stream of several choices (prompts or n, interleaved by `index`): relayed as the
    worker sends it. It moves to another worker only before the client has a chunk; after, it
    ends with an error saying so (the stream tracker resumes one choice, not several)."""

    def __init__(self, trip: Trip, client: ClientReply, body: Mapping[str, Any]) -> None:
        self.trip = trip
        self.client = client
        self.body = body

    async def attempt(self, transport: Transport, endpoint: Endpoint) -> web.StreamResponse:
        client = self.client
        async with transport.attempt(endpoint, self.trip.path, self.body,
                                     self.trip.headers_up) as up:  # fmt: skip
            if up.status != 200 or not up.is_sse:
                return await client.passthrough(up.status, await up.read_all(), up.headers)
            client.upstream(endpoint, up.headers)
            async for events in up.batches():
                batch: list[Mapping[str, Any]] = list(events)
                for i, event in enumerate(batch):
                    if "error" in event:
                        await client.send_many(batch[:i])
                        if _movable(event) and not client.started:
                            raise AttemptFailed(f"error event {event['error'].get('code')}")
                        await client.send(event)
                        return await client.finish()
                await client.send_many(batch)
            return await client.finish()

    async def salvage(self) -> web.StreamResponse | None:
        return None

    def progress(self) -> str:
        return " mid-stream" if self.client.started else ""

    async def move(self, failed: Endpoint, new: Endpoint, picking: Picking) -> str:
        if self.client.started:
            raise MigrationFailedError(
                f"worker {failed.id} failed mid-stream; a stream of several choices cannot "
                "resume on another worker: send the request again (a stream of one choice "
                "resumes)"
            )
        return "restarted"


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
