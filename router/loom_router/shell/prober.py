"""Marks an endpoint down the moment it refuses a connection, and back up once /health answers.

Owns the set of endpoints the router itself took down (an admin's `down` is never undone here)
and the re-probe loop; never routes and never probes endpoints that are up (the scraper's
interval already notices those).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from loom_router.core.endpoints import StaticEndpoints
from loom_router.errors import EndpointError, UpstreamError
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.upstream import Upstream

logger = logging.getLogger(__name__)

MAX_AUTO_DOWN = 4096


class Prober:
    def __init__(
        self,
        source: StaticEndpoints,
        upstream: Upstream,
        metrics: RouterMetrics,
        interval_s: float = 0.5,
        timeout_s: float = 2.0,
    ) -> None:
        self._source = source
        self._upstream = upstream
        self._metrics = metrics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._auto_down: set[str] = set()
        self._checks: dict[str, asyncio.Task[None]] = {}

    @property
    def auto_down(self) -> frozenset[str]:
        return frozenset(self._auto_down)

    def refused(self, endpoint_id: str, cause: str, label: str = "refused") -> None:
        """The endpoint refused a connection: out of routing now, re-probed from now on."""
        endpoint = self._source.snapshot().get(endpoint_id)
        if endpoint is None or endpoint.down or len(self._auto_down) >= MAX_AUTO_DOWN:
            return
        try:
            self._source.mark_down(endpoint_id)
        except EndpointError:
            return
        self._auto_down.add(endpoint_id)
        self._metrics.inc("marked_down", endpoint_id, label)
        logger.warning("endpoint marked down", extra={"endpoint": endpoint_id, "cause": cause})

    def suspect(self, endpoint_id: str) -> None:
        """A stream with it broke: probe /health now; no answer in time takes it down."""
        if endpoint_id in self._checks or len(self._checks) >= MAX_AUTO_DOWN:
            return
        task = asyncio.get_running_loop().create_task(self._check(endpoint_id))
        self._checks[endpoint_id] = task
        task.add_done_callback(lambda _: self._checks.pop(endpoint_id, None))

    async def _check(self, endpoint_id: str) -> None:
        endpoint = self._source.snapshot().get(endpoint_id)
        if endpoint is None or endpoint.down:
            return
        try:
            status, _ = await self._upstream.get(endpoint.url + "/health", self.timeout_s)
        except UpstreamError as exc:
            self.refused(endpoint_id, f"health probe failed: {exc}", "probe")
            return
        if status != 200:
            logger.info("endpoint unhealthy", extra={"endpoint": endpoint_id, "status": status})

    def admin_set(self, endpoint_id: str) -> None:
        """An admin marked it down or up (or replaced it): the admin's word stands."""
        self._auto_down.discard(endpoint_id)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            for endpoint_id in sorted(self._auto_down):
                await self.probe(endpoint_id)

    async def probe(self, endpoint_id: str) -> bool:
        """True if the endpoint answered /health and was put back into routing."""
        endpoint = self._source.snapshot().get(endpoint_id)
        if endpoint is None or not endpoint.down:
            self._auto_down.discard(endpoint_id)
            return False
        try:
            status, _ = await self._upstream.get(endpoint.url + "/health", self.timeout_s)
        except UpstreamError:
            return False
        if status != 200 or endpoint_id not in self._auto_down:
            return False
        with contextlib.suppress(EndpointError):
            self._source.mark_up(endpoint_id)
        self._auto_down.discard(endpoint_id)
        logger.info("endpoint back up", extra={"endpoint": endpoint_id})
        return True
