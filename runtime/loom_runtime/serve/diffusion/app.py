"""A diffusion worker's servers: the image and video routes, probes and /metrics over one
DiffusionEngine, the gRPC control service (when a control port is set), and their shutdown order.

Owns wiring; never runs engine steps (the engine's own thread does), never decides a status code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.serve import probes
from loom_runtime.serve.app import Servers, ServeSettings, error_middleware
from loom_runtime.serve.diffusion import api
from loom_runtime.serve.diffusion.control import DiffusionControl
from loom_runtime.serve.diffusion.metrics import DiffusionMetrics
from loom_runtime.serve.diffusion.protocol import PromptSettings
from loom_runtime.serve.diffusion.video_jobs import JobStore

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


def diffusion_context(
    engine: DiffusionEngine, settings: ServeSettings, jobs: JobSettings
) -> api.DiffusionApiContext:
    return api.DiffusionApiContext(
        engine=engine,
        prompts=PromptSettings(engine.config.model_name, engine.config.text_len),
        jobs=JobStore(jobs.max_jobs, jobs.ttl_s),
        image_timeout_s=settings.stall_timeout_s,
        started=int(time.time()),
    )


def build_diffusion_app(
    engine: DiffusionEngine, settings: ServeSettings, jobs: JobSettings, metrics: DiffusionMetrics
) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=settings.max_body_bytes)
    api.add_routes(app, diffusion_context(engine, settings, jobs))
    probes.add_routes(app, probes.ProbeContext(DiffusionHealth(engine), metrics))
    return app


class DiffusionWorker:
    """The running servers of a diffusion worker; `stop()` drains, then closes them."""

    def __init__(
        self,
        control: DiffusionControl,
        settings: ServeSettings,
        jobs: JobSettings,
        resolve_source: Callable[[str], Path],
    ) -> None:
        self.control, self.engine = control, control.engine
        self.settings, self.jobs = settings, jobs
        self.metrics = DiffusionMetrics(self.engine.config.model_name, self.engine)
        self._servers = Servers(settings, resolve_source)

    async def start(self) -> None:
        s = self.settings
        app = build_diffusion_app(self.engine, s, self.jobs, self.metrics)
        name = self.engine.config.model_name
        await self._servers.start(app, self.control, name, self.engine.step_thread_alive)
        logger.info(
            "serving diffusion",
            extra={"host": s.host, "port": s.port, "control_port": s.control_port},
        )

    async def stop(self) -> None:
        await self._servers.stop(self.engine.pause)
