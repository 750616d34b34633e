"""A diffusion worker's server: the image and video routes, probes and /metrics over one
DiffusionEngine, and its shutdown order.

Owns wiring; never runs engine steps (the engine's own thread does), never decides a status code.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aiohttp import web

from loom_runtime.engine.diffusion_engine import DiffusionEngine
from loom_runtime.serve import diffusion_api, probes
from loom_runtime.serve.app import ServeSettings, error_middleware
from loom_runtime.serve.diffusion_metrics import DiffusionMetrics
from loom_runtime.serve.diffusion_protocol import PromptSettings
from loom_runtime.serve.video_jobs import JobStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSettings:
    """The video job store's bounds; defaults documented here."""

    max_jobs: int = 256  # jobs kept (unfinished + finished within their TTL); beyond: 503
    ttl_s: float = 3600.0  # how long a finished job (and its MP4) stays downloadable


class DiffusionHealth:
    """What /health and /ready report about a diffusion engine."""

    def __init__(self, engine: DiffusionEngine) -> None:
        self._engine = engine

    def healthy(self) -> bool:
        return self._engine.step_thread_alive()

    def ready(self) -> bool:
        return self.healthy() and self._engine.stats().admission_open


def build_diffusion_app(
    engine: DiffusionEngine, settings: ServeSettings, jobs: JobSettings, metrics: DiffusionMetrics
) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=settings.max_body_bytes)
    ctx = diffusion_api.DiffusionApiContext(
        engine=engine,
        prompts=PromptSettings(engine.config.model_name, engine.config.text_len),
        jobs=JobStore(jobs.max_jobs, jobs.ttl_s),
        image_timeout_s=settings.stall_timeout_s,
        started=int(time.time()),
    )
    diffusion_api.add_routes(app, ctx)
    probes.add_routes(app, probes.ProbeContext(DiffusionHealth(engine), metrics))
    return app


class DiffusionWorker:
    """The running HTTP server of a diffusion worker; `stop()` drains, then closes it."""

    def __init__(self, engine: DiffusionEngine, settings: ServeSettings, jobs: JobSettings) -> None:
        self.engine, self.settings, self.jobs = engine, settings, jobs
        self.metrics = DiffusionMetrics(engine.config.model_name, engine)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        s = self.settings
        app = build_diffusion_app(self.engine, s, self.jobs, self.metrics)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, s.host, s.port).start()
        logger.info("serving diffusion", extra={"host": s.host, "port": s.port})

    async def stop(self) -> None:
        drained = await asyncio.to_thread(self.engine.pause, "wait", self.settings.shutdown_drain_s)
        if not drained:
            logger.warning("shutdown: diffusion requests still in flight; they will be aborted")
        if self._runner is not None:
            await self._runner.cleanup()
