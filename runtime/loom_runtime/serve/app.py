"""One worker's servers on one event loop: the HTTP app (OpenAI + probes) and the gRPC control.

Owns wiring, the error middleware and the shutdown order; never runs engine steps (the engine's
own thread does) and never decides a status code (errors.py does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import grpc
from aiohttp import web

from loom_runtime.card.chat_parsers import ChatParsers
from loom_runtime.engine.engine import Engine
from loom_runtime.errors import LoomError
from loom_runtime.serve import draw_api, openai_api, probes, responses_api, tokenize_api
from loom_runtime.serve.api_context import ApiContext
from loom_runtime.serve.bridge import Mailbox
from loom_runtime.serve.control_service import (
    ControlledEngine,
    ControlService,
    ControlSettings,
    start_control_server,
)
from loom_runtime.serve.errors import classify, http_error
from loom_runtime.serve.metrics import ServerMetrics
from loom_runtime.serve.prepare import ModelLimits
from loom_runtime.wire.headers import REQUEST_ID_HEADER

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ServeSettings:
    """How the worker listens and how long it waits; defaults documented here."""

    host: str = "127.0.0.1"
    port: int = 8000
    role: str = "aggregated"
    control_port: int | None = None  # None: no control service
    control_token: str = ""  # required when control_port is set
    stall_timeout_s: float = 300.0  # longest wait for a request's next engine output
    drain_timeout_s: float = 600.0  # Pause(WAIT) default and upper bound
    shutdown_drain_s: float = 30.0  # on SIGTERM: how long in-flight requests may finish
    max_body_bytes: int = 16 * 1024 * 1024  # largest request body accepted (413 beyond)
    strict_fields: bool = False  # refuse unknown request fields (default: ignore and name them)
    # How chat output is read back: the tool-call and reasoning parsers (the card's, else its
    # family's; --tool-call-parser / --reasoning-parser override them). None: neither.
    chat_parsers: ChatParsers = field(default_factory=ChatParsers)
    # A card with a think_then_draw program (a mot model): /v1/images/generations runs it.
    draw: draw_api.DrawSettings | None = None


class EngineHealth:
    """What /health and /ready report about an engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def healthy(self) -> bool:
        return self._engine.step_thread_alive()

    def ready(self) -> bool:
        return self.healthy() and self._engine.stats().admission_open


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as an OpenAI error object with the status errors.py chose."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        detail = exc.text if exc.status == 413 and exc.text else exc.reason  # names the limit
        reply = http_error(exc.status, f"{request.method} {request.path}: {detail}")
    except Exception as exc:
        reply = classify(exc, request.headers.get(REQUEST_ID_HEADER))
        if not isinstance(exc, LoomError):
            logger.exception("request failed", extra={"path": request.path})
        elif reply.http_status >= 500:
            logger.warning("request failed: %s", reply.message, extra={"path": request.path})
        else:
            logger.info("request refused: %s", reply.message, extra={"path": request.path})
    return web.json_response(reply.body(), status=reply.http_status)


def api_context(
    engine: Engine, settings: ServeSettings, metrics: ServerMetrics, mailbox: Mailbox | None
) -> ApiContext:
    limits = ModelLimits(
        model_name=engine.config.model_name,
        max_model_len=engine.max_model_len,
        vocab_size=engine.model_config.vocab_size,
    )
    return ApiContext(
        engine, limits, metrics, settings.stall_timeout_s, int(time.time()), settings.strict_fields,
        mailbox, settings.chat_parsers,
    )  # fmt: skip


def build_http_app(
    engine: Engine, settings: ServeSettings, metrics: ServerMetrics, mailbox: Mailbox | None = None
) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=settings.max_body_bytes)
    openai_api.add_routes(app, api_context(engine, settings, metrics, mailbox))
    tokenize_api.add_routes(app)
    responses_api.add_routes(app)
    if settings.draw is not None:
        ctx = draw_api.DrawContext(
            engine, settings.draw, engine.config.model_name, settings.stall_timeout_s, mailbox
        )
        draw_api.add_routes(app, ctx)
    probes.add_routes(app, probes.ProbeContext(EngineHealth(engine), metrics))
    return app


class Servers:
    """A worker's HTTP site and gRPC control server: started together; stopped in order —
    admission closed and in-flight requests drained (bounded), then control, then HTTP."""

    def __init__(self, settings: ServeSettings, resolve_source: Callable[[str], Path]) -> None:
        self.settings = settings
        self._resolve_source = resolve_source
        self._runner: web.AppRunner | None = None
        self._control: grpc.aio.Server | None = None

    async def start(
        self,
        app: web.Application,
        control: ControlledEngine,
        model_name: str,
        healthy: Callable[[], bool],
    ) -> None:
        s = self.settings
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, s.host, s.port).start()
        self._control = await start_control(control, s, model_name, self._resolve_source, healthy)

    async def stop(self, pause: Callable[[Literal["wait", "abort"], float], bool]) -> None:
        drained = await asyncio.to_thread(pause, "wait", self.settings.shutdown_drain_s)
        if not drained:
            logger.warning("shutdown: requests still in flight; they will be aborted")
        if self._control is not None:
            await self._control.stop(grace=1.0)
        if self._runner is not None:
            await self._runner.cleanup()


class Worker:
    """The running servers of one worker; `stop()` drains and closes them in order."""

    def __init__(
        self, engine: Engine, settings: ServeSettings, resolve_source: Callable[[str], Path]
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = ServerMetrics(engine.config.model_name, engine)
        self._servers = Servers(settings, resolve_source)

    async def start(self) -> None:
        s = self.settings
        mailbox = Mailbox(asyncio.get_running_loop())
        app = build_http_app(self.engine, s, self.metrics, mailbox)
        name = self.engine.config.model_name
        await self._servers.start(app, self.engine, name, self.engine.step_thread_alive)
        logger.info(
            "serving",
            extra={"host": s.host, "port": s.port, "control_port": s.control_port, "role": s.role},
        )

    async def stop(self) -> None:
        """Close admission, let in-flight requests finish (bounded), then close the servers."""
        await self._servers.stop(self.engine.pause)


async def start_control(
    engine: ControlledEngine,
    s: ServeSettings,
    model_name: str,
    resolve_source: Callable[[str], Path],
    healthy: Callable[[], bool],
) -> grpc.aio.Server | None:
    """The gRPC control server of a worker's engine, or None without a control port."""
    if s.control_port is None:
        return None
    push = engine if isinstance(engine, Engine) else None
    settings = ControlSettings(
        model_name, s.role, s.drain_timeout_s, resolve_source, healthy, push=push, host=s.host,
        token=s.control_token or "",
    )  # fmt: skip
    service = ControlService(engine, settings)
    server, _ = await start_control_server(service, s.host, s.control_port, s.control_token)
    return server
