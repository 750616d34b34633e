"""One transport attempt: a request sent to one worker, counted in flight and in its load while
it lasts, and the registry of attempts an admin's migrate acts on.

Owns turning every failure another worker can make good into one typed `AttemptFailed` (a
refused connection also marks the worker down, a broken one makes it suspect); never retries,
never picks a worker and never calls back into whoever started the attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from loom_router.core.endpoints import Endpoint
from loom_router.core.load import LoadTracker
from loom_router.errors import RouterError, UpstreamError, UpstreamRefusedError
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.prober import Prober
from loom_router.shell.upstream import Upstream, UpstreamStream

RETRY_STATUSES = frozenset({502, 503, 504})
"""Answers that mean "not here, not now" (paused, draining, stalled): try another worker."""
MOVED_BY_ADMIN = "moved by an admin"


class AttemptFailed(RouterError):
    """This attempt failed in a way another worker can make good (the message says how)."""


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


class Transport:
    """Opens attempts on workers; `flights` is what the admin API's migrate reaches."""

    def __init__(
        self, upstream: Upstream, prober: Prober, metrics: RouterMetrics, load: LoadTracker
    ) -> None:
        self.upstream = upstream
        self.prober = prober
        self.metrics = metrics
        self.load = load
        self.flights = Flights()

    @asynccontextmanager
    async def attempt(
        self,
        endpoint: Endpoint,
        path: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
    ) -> AsyncIterator[UpstreamStream]:
        """The worker's answer, open. Raises AttemptFailed when the worker refused, broke, was
        moved away by an admin, or answered a RETRY_STATUSES status."""
        flight = self.flights.add(endpoint.id)
        self.load.begin(endpoint.id)
        try:
            async with self.upstream.stream(endpoint, path, body, headers) as up:
                flight.stream = up
                if flight.moved:
                    raise AttemptFailed(MOVED_BY_ADMIN)
                if up.status in RETRY_STATUSES:
                    await up.read_all()
                    raise AttemptFailed(f"answered {up.status}")
                yield up
        except UpstreamRefusedError as exc:
            self._count(endpoint.id, "refused")
            self.prober.refused(endpoint.id, str(exc))
            raise AttemptFailed(str(exc)) from exc
        except UpstreamError as exc:
            self._count(endpoint.id, "broken")
            if not flight.moved:
                self.prober.suspect(endpoint.id)
            raise AttemptFailed(MOVED_BY_ADMIN if flight.moved else str(exc)) from exc
        finally:
            self.load.end(endpoint.id)
            self.flights.remove(flight)

    def _count(self, endpoint_id: str, kind: str) -> None:
        self.metrics.inc("upstream_errors", endpoint_id, kind)
