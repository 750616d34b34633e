"""Scrapes every endpoint's /metrics on an interval into the LoadTracker (the queue, running and
kv_cache_utilization scorers read it), and takes endpoints that refuse connections out of routing.

Owns the scrape schedule (one task per endpoint at a time, each bounded by a timeout); never
treats a failed or stale scrape as zero load (the tracker forgets it: unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from loom_router.core.endpoints import Endpoint, EndpointSource
from loom_router.core.load import LoadTracker, parse_metrics
from loom_router.errors import MetricsParseError, UpstreamError, UpstreamRefusedError
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.upstream import Upstream

logger = logging.getLogger(__name__)

RefusedHook = Callable[[str, str], None]
"""Called with (endpoint id, cause) when an endpoint refuses connections."""


class MetricsScraper:
    def __init__(
        self,
        source: EndpointSource,
        tracker: LoadTracker,
        upstream: Upstream,
        metrics: RouterMetrics,
        on_refused: RefusedHook,
        interval_s: float = 0.1,
        timeout_s: float = 1.0,
    ) -> None:
        self._source = source
        self._tracker = tracker
        self._upstream = upstream
        self._metrics = metrics
        self._on_refused = on_refused
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._last_ok: dict[str, float] = {}

    def ages(self, now: float) -> dict[str, float]:
        """Seconds since each endpoint's last good scrape (endpoints never scraped are absent)."""
        return {eid: now - at for eid, at in self._last_ok.items()}

    async def run(self) -> None:
        """Scrape until cancelled."""
        try:
            while True:
                snapshot = self._source.snapshot()
                known = set(snapshot.by_id)
                for gone in [eid for eid in self._last_ok if eid not in known]:
                    del self._last_ok[gone]
                for endpoint in snapshot.endpoints:
                    running = self._tasks.get(endpoint.id)
                    if endpoint.down or (running is not None and not running.done()):
                        continue
                    self._tasks[endpoint.id] = asyncio.create_task(self.scrape(endpoint))
                for eid in [e for e, t in self._tasks.items() if t.done() and e not in known]:
                    del self._tasks[eid]
                await asyncio.sleep(self.interval_s)
        finally:
            for task in self._tasks.values():
                task.cancel()
            for task in self._tasks.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def scrape(self, endpoint: Endpoint) -> None:
        """One scrape of one endpoint; every outcome is recorded, none raises."""
        started = time.monotonic()
        try:
            status, text = await self._upstream.get(endpoint.url + "/metrics", self.timeout_s)
            if status != 200:
                raise MetricsParseError(f"/metrics answered {status}")
            parsed = await asyncio.to_thread(parse_metrics, text)
        except UpstreamRefusedError:
            self._failed(endpoint.id, "refused")
            self._on_refused(endpoint.id, "scrape refused")
            return
        except (UpstreamError, MetricsParseError) as exc:
            self._failed(endpoint.id, str(exc))
            return
        if self._source.snapshot().get(endpoint.id) is None:
            return  # it left while we scraped: keep the tracker bounded by known endpoints
        self._tracker.record_scrape(endpoint.id, parsed, started)
        self._last_ok[endpoint.id] = started

    def _failed(self, endpoint_id: str, why: str) -> None:
        self._tracker.record_scrape_failure(endpoint_id)
        self._metrics.inc("scrape_failures", endpoint_id)
        logger.debug("scrape failed", extra={"endpoint": endpoint_id, "why": why})
