"""A worker that serves an LLM and a diffusion model from one process on one step thread
(`--diffusion-card`): the text routes and the image/video routes on one HTTP app, one
/v1/models listing both, merged /metrics (with each engine's compute time), and a control
service that drains both and syncs the LLM's weights.

Owns wiring the two engines' servers together; never picks which engine steps next
(engine/shared_step_thread.py does) and never serves a route itself beyond /v1/models.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Literal

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.shared_step_thread import SharedStepThread
from loom_runtime.engine.types import EngineStats
from loom_runtime.serve import openai_api, probes, responses_api, tokenize_api
from loom_runtime.serve.app import Servers, ServeSettings, api_context, error_middleware
from loom_runtime.serve.bridge import Mailbox
from loom_runtime.serve.diffusion import api as diffusion_api
from loom_runtime.serve.diffusion.app import JobSettings, diffusion_context
from loom_runtime.serve.diffusion.metrics import DiffusionMetrics
from loom_runtime.serve.metrics import ServerMetrics

logger = logging.getLogger(__name__)


class DualControl:
    """The control service's engine: status and weight loads are the LLM's; drains take both
    (a fleet drains a worker before it syncs or stops it)."""

    def __init__(self, llm: Engine, dit: DiffusionEngine) -> None:
        self.llm, self.dit = llm, dit

    def stats(self) -> EngineStats:
        return self.llm.stats()

    def in_flight(self) -> int:
        return self.llm.in_flight() + self.dit.in_flight()

    def pause(self, mode: Literal["wait", "abort"] = "wait", timeout: float | None = None) -> bool:
        drained = self.dit.pause(mode, timeout)
        return self.llm.pause(mode, timeout) and drained

    def resume(self) -> None:
        self.dit.resume()
        self.llm.resume()

    def load_weights(self, path: str, version: str) -> None:
        self.llm.load_weights(path, version)


class DualHealth:
    def __init__(self, llm: Engine, dit: DiffusionEngine) -> None:
        self.llm, self.dit = llm, dit

    def healthy(self) -> bool:
        return self.llm.step_thread_alive()

    def ready(self) -> bool:
        return self.healthy() and self.llm.stats().admission_open


class _MergedCollector(Collector):
    """Families of several registries as one exposition: same-named families merged, a sample
    that two registries both report (the process collector's) kept once."""

    def __init__(self, registries: Iterable[CollectorRegistry]) -> None:
        self._registries = tuple(registries)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for registry in self._registries:
            for family in registry.collect():
                into = merged.setdefault(family.name, Metric(family.name, family.documentation,
                                                              family.type))  # fmt: skip
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key not in seen:
                        seen.add(key)
                        into.samples.append(sample)
        yield from merged.values()


class _SharedThreadCollector(Collector):
    def __init__(self, shared_thread: SharedStepThread) -> None:
        self._shared_thread = shared_thread

    def collect(self) -> Iterator[Metric]:
        stats = self._shared_thread.stats()
        steps = CounterMetricFamily("loom:engine_steps", "Steps run, by engine.", labels=["engine"])
        spent = CounterMetricFamily(
            "loom:engine_compute_seconds", "Step time spent, by engine.", labels=["engine"]
        )
        predicted = GaugeMetricFamily(
            "loom:engine_predicted_step_seconds",
            "The engine's predicted next step (EWMA of its measured steps).", labels=["engine"],
        )  # fmt: skip
        for s in stats:
            steps.add_metric([s.name], s.steps)
            spent.add_metric([s.name], s.compute_s)
            predicted.add_metric([s.name], s.predicted_step_s)
        yield from (steps, spent, predicted)


class DualMetrics:
    """Both engines' metrics and the shared step thread's, rendered as one exposition."""

    def __init__(
        self, llm: ServerMetrics, dit: DiffusionMetrics, shared_thread: SharedStepThread
    ) -> None:
        self.llm = llm
        own = CollectorRegistry()
        own.register(_SharedThreadCollector(shared_thread))
        self.registry = CollectorRegistry()
        self.registry.register(_MergedCollector((llm.registry, dit.registry, own)))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def build_dual_app(
    llm: Engine,
    dit: DiffusionEngine,
    settings: ServeSettings,
    jobs: JobSettings,
    metrics: DualMetrics,
    mailbox: Mailbox,
) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=settings.max_body_bytes)
    text = api_context(llm, settings, metrics.llm, mailbox)
    media = diffusion_context(dit, settings, jobs)
    openai_api.add_routes(app, text, with_models=False)
    tokenize_api.add_routes(app)
    responses_api.add_routes(app)
    diffusion_api.add_routes(app, media, with_models=False)
    cards = [openai_api.model_card(text), diffusion_api.model_card(media)]

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": cards})

    app.router.add_get("/v1/models", models)
    probes.add_routes(app, probes.ProbeContext(DualHealth(llm, dit), metrics))
    return app


class DualWorker:
    """The running servers of a worker serving both; `stop()` drains both, then closes."""

    def __init__(
        self,
        llm: Engine,
        dit: DiffusionEngine,
        shared_thread: SharedStepThread,
        settings: ServeSettings,
        jobs: JobSettings,
        resolve_source: Callable[[str], Path],
    ) -> None:
        self.llm, self.dit, self.settings, self.jobs = llm, dit, settings, jobs
        self.control = DualControl(llm, dit)
        text = ServerMetrics(llm.config.model_name, llm)
        self.metrics = DualMetrics(
            text, DiffusionMetrics(dit.config.model_name, dit), shared_thread
        )
        self._servers = Servers(settings, resolve_source)

    async def start(self) -> None:
        s = self.settings
        mailbox = Mailbox(asyncio.get_running_loop())
        app = build_dual_app(self.llm, self.dit, s, self.jobs, self.metrics, mailbox)
        name = self.llm.config.model_name
        await self._servers.start(app, self.control, name, self.llm.step_thread_alive)
        logger.info("serving an LLM and a diffusion model", extra={"host": s.host, "port": s.port})

    async def stop(self) -> None:
        await self._servers.stop(self.control.pause)
