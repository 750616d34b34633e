"""The operational routes: /health (process and engine thread alive), /ready, /metrics.

Owns what "healthy" and "ready" mean over HTTP; never blocks the event loop on engine locks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from loom_runtime.serve.metrics import CONTENT_TYPE


class EngineProbe(Protocol):
    def healthy(self) -> bool:
        """The engine thread is running and has not died."""
        ...

    def ready(self) -> bool:
        """Started, healthy and admitting requests."""
        ...


class MetricsSource(Protocol):
    def render(self) -> bytes:
        """The Prometheus exposition text (may block: called off the event loop)."""
        ...


@dataclass(frozen=True)
class ProbeContext:
    probe: EngineProbe
    metrics: MetricsSource


PROBE_CONTEXT = web.AppKey("probe_context", ProbeContext)


async def health(request: web.Request) -> web.Response:
    ok = await asyncio.to_thread(request.app[PROBE_CONTEXT].probe.healthy)
    if ok:
        return web.json_response({"status": "ok"})
    return web.json_response({"status": "engine thread is not running"}, status=503)


async def ready(request: web.Request) -> web.Response:
    ctx = request.app[PROBE_CONTEXT]
    ok = await asyncio.to_thread(ctx.probe.ready)
    if ok:
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "not ready (starting, paused or unhealthy)"}, status=503)


async def metrics(request: web.Request) -> web.Response:
    body = await asyncio.to_thread(request.app[PROBE_CONTEXT].metrics.render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def add_routes(app: web.Application, ctx: ProbeContext) -> None:
    app[PROBE_CONTEXT] = ctx
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
