"""The router process: wires config, state, shells and the two HTTP apps, and runs until signalled.

Owns construction and shutdown order (stop taking requests → cancel loops → close sockets);
never routes (dispatch.py) and never decides a status (loom_router.errors).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from loom_router.core.endpoints import EndpointSnapshot, StaticEndpoints
from loom_router.core.state import RouterState
from loom_router.errors import ConfigError
from loom_router.shell.admin import AdminApp
from loom_router.shell.config import (
    FlagsError,
    RouterFileConfig,
    RouterFlags,
    add_arguments,
    env,
    flags_from_args,
    load_file_config,
)
from loom_router.shell.dispatch import Dispatcher
from loom_router.shell.kv_subscriber import KVSubscriber
from loom_router.shell.media_proxy import MediaProxy, MediaSettings
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.picking import Picking
from loom_router.shell.pod_watch import PodWatch, kubernetes_pod_api
from loom_router.shell.prober import Prober
from loom_router.shell.proxy import ProxyApp
from loom_router.shell.scraper import MetricsScraper
from loom_router.shell.transport import Transport
from loom_router.shell.upstream import Upstream, UpstreamTimeouts
from loom_router.shell.workflow_proxy import WorkflowProxy, own_url
from loom_runtime.errors import CheckpointError
from loom_runtime.wire.metric_names import ROUTER_ENDPOINTS, ROUTER_IN_FLIGHT, ROUTER_INDEX_ENTRIES
from loom_runtime.wire.process import configure_logging, serve_until_signalled
from loom_runtime.wire.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


def load_tokenizer(path: Path) -> Tokenizer:
    """The workers' tokenizer (a checkpoint directory or its tokenizer.json), for the precise
    prefix scorer: the router renders and encodes prompts with the very code the workers use."""
    try:
        return Tokenizer.from_dir(path)
    except CheckpointError as exc:
        raise ConfigError(f"tokenizer_path: {exc}") from exc


class RouterServer:
    """Everything one router replica runs; `start()` then `stop()` on one event loop."""

    def __init__(self, config: RouterFileConfig, flags: RouterFlags) -> None:
        self.config = config
        self.flags = flags
        self.source = StaticEndpoints(config.endpoints)
        settings = config.settings
        if flags.max_index_entries is not None:
            settings = replace(settings, max_index_entries=flags.max_index_entries)
        self.state = RouterState(settings)
        self.metrics = RouterMetrics()
        self.upstream = Upstream(UpstreamTimeouts(connect_s=config.settings.health_timeout_s))
        self.prober = Prober(self.source, self.upstream, self.metrics,
                             timeout_s=config.settings.health_timeout_s)  # fmt: skip
        self.scraper = MetricsScraper(
            self.source, self.state.load, self.upstream, self.metrics, self.prober.refused,
            interval_s=flags.scrape_interval_s,
            timeout_s=min(1.0, config.settings.health_timeout_s),
        )  # fmt: skip
        self.subscriber = KVSubscriber(self.state.prefix, self.metrics)
        path = config.tokenizer_path
        tokenizer = None if path is None else load_tokenizer(path)
        if tokenizer is None and config.settings.prefix_scorer == "precise":
            logger.warning(
                "precise prefix scoring needs tokenizer_path in ROUTER.json; without it requests "
                "are routed by load and session only"
            )
        self.picking = Picking(
            source=self.source, state=self.state, upstream=self.upstream, metrics=self.metrics,
            policy=flags.policy, seed=flags.seed,
        )  # fmt: skip
        self.transport = Transport(self.upstream, self.prober, self.metrics, self.state.load)
        self.dispatcher = Dispatcher(
            state=self.state, picking=self.picking, upstream=self.upstream,
            transport=self.transport, metrics=self.metrics, prober=self.prober,
            tokenizer=tokenizer,
        )  # fmt: skip
        self.media: MediaProxy | None = None
        if config.diffusion is not None:
            limit = config.settings.migration_limit
            diffusion = config.diffusion
            media = MediaSettings(diffusion.default_steps, limit + 1, limit, diffusion.text)
            workflows = None
            if config.workflows:
                own = own_url(flags.host, flags.port)
                workflows = WorkflowProxy(config.workflows, self.upstream, own)
            self.media = MediaProxy(self.source, self.upstream, self.prober, self.metrics, media,
                                    workflows=workflows)  # fmt: skip
        self.proxy = ProxyApp(
            self.dispatcher, self.metrics, config.model_name, flags.api_keys,
            max_body_bytes=flags.max_body_bytes, media=self.media,
        )  # fmt: skip
        self.admin = AdminApp(self.source, self.transport.flights, self.prober, flags.admin_token)
        self.pod_watch: PodWatch | None = None
        if flags.watch_pods:
            list_pods, watch_pods = kubernetes_pod_api()
            self.pod_watch = PodWatch(
                self.source, flags.namespace, flags.watch_pods, list_pods, watch_pods
            )
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._add_gauges()

    def _on_endpoints(self, snapshot: EndpointSnapshot) -> None:
        for gone in self.state.on_endpoints(snapshot):
            self.metrics.forget_endpoint(gone)
        for endpoint in snapshot.endpoints:
            self.metrics.know_endpoint(endpoint.id)
        if self.media is None:  # diffusion workers have no KV cache to publish events about
            self.subscriber.sync(snapshot)

    async def start(self) -> None:
        await self.upstream.start()
        self.source.subscribe(self._on_endpoints)
        self._on_endpoints(self.source.snapshot())
        if self.pod_watch is not None:
            self.pod_watch.start()
        self.subscriber.start()
        self._tasks = [asyncio.create_task(self.scraper.run()),
                       asyncio.create_task(self.prober.run()),
                       asyncio.create_task(self._watch_hashes())]  # fmt: skip
        o = self.flags
        for app, host, port in ((self.proxy.app(), o.host, o.port),
                                (self.admin.app(), o.admin_host, o.admin_port)):  # fmt: skip
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            self._runners.append(runner)
            await web.TCPSite(runner, host, port).start()
        logger.info("router serving", extra={"port": o.port, "admin_port": o.admin_port,
                                             "endpoints": len(self.source.snapshot())})  # fmt: skip

    async def stop(self) -> None:
        if self.pod_watch is not None:
            self.pod_watch.stop()
        for runner in self._runners:
            await runner.cleanup()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(self.subscriber.close)
        if self.media is not None and self.media.workflows is not None:
            await self.media.workflows.close()
        await self.upstream.close()

    async def _watch_hashes(self, interval_s: float = 2.0) -> None:
        """Say loudly when an engine's KV events can never match the router's hashes (the
        precise scorer would otherwise score it zero in silence)."""
        told: dict[str, str] = {}
        while True:
            await asyncio.sleep(interval_s)
            problems = dict(self.state.prefix.stats().hash_problems)
            for endpoint_id, problem in problems.items():
                if told.get(endpoint_id) != problem:
                    logger.error("KV events of %s cannot match the router: %s", endpoint_id,
                                 problem, extra={"endpoint": endpoint_id})  # fmt: skip
            told = problems

    def _add_gauges(self) -> None:
        m, state, source = self.metrics, self.state, self.source

        def endpoints() -> Iterable[tuple[tuple[str, ...], float]]:
            counts = dict.fromkeys(("routable", "draining", "down", "not_ready"), 0.0)
            for e in source.snapshot().endpoints:
                key = "down" if e.down else "draining" if e.draining else (
                    "not_ready" if not e.ready else "routable")  # fmt: skip
                counts[key] += 1
            return [((k,), v) for k, v in counts.items()]

        def in_flight() -> Iterable[tuple[tuple[str, ...], float]]:
            view = state.load.view(time.monotonic())
            return [((e.id,), float(view.in_flight_of(e.id))) for e in source.snapshot().endpoints]

        def ages() -> Iterable[tuple[tuple[str, ...], float]]:
            now = time.monotonic()
            return [((eid,), age) for eid, age in sorted(self.scraper.ages(now).items())]

        def stale() -> Iterable[tuple[tuple[str, ...], float]]:
            fresh = state.load.view(time.monotonic()).fresh
            return [((e.id,), 0.0 if e.id in fresh else 1.0) for e in source.snapshot().endpoints]

        def entries() -> Iterable[tuple[tuple[str, ...], float]]:
            out = [(("precise",), float(state.prefix.stats().entries)),
                   (("approximate",), float(state.approx.entries()))]  # fmt: skip
            if state.in_flight is not None:
                out.append((("in_flight",), float(len(state.in_flight))))
            return out

        def evictions() -> Iterable[tuple[tuple[str, ...], float]]:
            out = [(("precise",), float(state.prefix.stats().evictions)),
                   (("approximate",), float(state.approx.evictions))]  # fmt: skip
            if state.in_flight is not None:
                out.append((("in_flight",), float(state.in_flight.evictions)))
            return out

        def problems() -> Iterable[tuple[tuple[str, ...], float]]:
            return [((eid,), 1.0) for eid in sorted(state.prefix.stats().hash_problems)]

        m.add_gauge(ROUTER_ENDPOINTS, "Endpoints by routing state.", ("state",), endpoints)
        m.add_gauge(ROUTER_IN_FLIGHT, "Requests the router has on each endpoint.", ("endpoint",),
                    in_flight)  # fmt: skip
        m.add_gauge("scrape_age_seconds", "Seconds since the last good /metrics scrape.",
                    ("endpoint",), ages)  # fmt: skip
        m.add_gauge("scrape_stale", "1 when the endpoint's load is unknown (stale scrape).",
                    ("endpoint",), stale)  # fmt: skip
        m.add_gauge(ROUTER_INDEX_ENTRIES, "Prefix-index entries (in_flight: prompts just routed).",
                    ("index",), entries)  # fmt: skip
        m.add_gauge("index_evictions", "Prefix-index entries evicted to stay bounded.",
                    ("index",), evictions, counter=True)  # fmt: skip
        m.add_gauge("index_hash_problems", "Endpoints whose KV-event hashes cannot match.",
                    ("endpoint",), problems)  # fmt: skip
        m.add_gauge("sessions", "Sessions pinned to an endpoint.", (),
                    lambda: [((), float(len(state.sessions)))])  # fmt: skip
        m.add_gauge("session_evictions", "Sessions dropped, oldest first, to stay bounded.", (),
                    lambda: [((), float(state.sessions.evictions))], counter=True)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    try:
        flags = flags_from_args(args, env())
        configure_logging(flags.log_level.upper())
        config = load_file_config(flags.config)
        server = RouterServer(config, flags)
    except (FlagsError, ConfigError, ValueError) as exc:
        print(f"loom router: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve_until_signalled(server, logger, "router stopping"))
    except OSError as exc:
        print(f"loom router: cannot listen: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loom_router",
        description="The Loom router: OpenAI proxy + endpoint picker + admin API.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
