"""The router's OpenAI-facing HTTP app: /v1/completions, /v1/chat/completions and /v1/responses
(responses_proxy.py) (or, for a diffusion fleet, the image and video routes of media_proxy.py),
/v1/models, /tokenize and /detokenize (model_info.py), /health, /ready and /metrics, with
request ids and optional API keys.

Owns the routes and the middlewares (request id, API key, the one place errors become
statuses); never picks endpoints (dispatch.py) and never holds routing state.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from loom_router.core.filters import SERVING_ROLES
from loom_router.errors import RouterError, UnauthorizedError, classify, http_error_body
from loom_router.shell.config import RouterFlags
from loom_router.shell.dispatch import Dispatcher
from loom_router.shell.media_proxy import MediaProxy
from loom_router.shell.metrics import CONTENT_TYPE, RouterMetrics
from loom_router.shell.model_info import ModelInfo
from loom_router.shell.responses_proxy import ResponsesProxy
from loom_runtime.wire.headers import REQUEST_ID_HEADER
from loom_runtime.wire.openai.request_id import router_request_id

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUEST_ID = web.RequestKey("request_id", str)
_OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
_ROUTE_LABELS = {"/v1/completions": "completions", "/v1/chat/completions": "chat",
                 "/v1/responses": "responses",
                 "/v1/models": "models", "/v1/images/generations": "images",
                 "/tokenize": "tokenize", "/detokenize": "detokenize"}  # fmt: skip


def request_id_of(request: web.Request) -> str:
    """The client's x-request-id if it is kept (short and printable), else a new one."""
    return router_request_id(request.headers.get(REQUEST_ID_HEADER, ""))


def _route_label(path: str) -> str:
    return "videos" if path.startswith("/v1/videos") else "other"


class ProxyApp:
    """Builds the aiohttp app around one Dispatcher."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        metrics: RouterMetrics,
        model_name: str,
        api_keys: Sequence[str] = (),
        max_body_bytes: int = RouterFlags.max_body_bytes,
        media: MediaProxy | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.media = media
        self._max_body = max_body_bytes
        self.metrics = metrics
        self.model_name = model_name
        self._keys = tuple(k.encode() for k in api_keys if k)

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors, self._auth], client_max_size=self._max_body
        )
        if self.media is not None:
            self.media.add_routes(app, lambda request: request[REQUEST_ID])
        if self.media is None or self.media.settings.images_only:
            app.router.add_post("/v1/completions", self.completions)
            app.router.add_post("/v1/chat/completions", self.chat)
            ResponsesProxy(self.dispatcher).add_routes(app, REQUEST_ID)
        flows = (
            ()
            if self.media is None or self.media.workflows is None
            else tuple(self.media.workflows.workflows)
        )
        info = ModelInfo(self.dispatcher.picking, self.dispatcher.upstream, self.model_name,
                         REQUEST_ID, flows)  # fmt: skip
        info.add_routes(app, tokenize=self.media is None)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.render_metrics)
        return app

    # --- middlewares ---------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Request id on everything; every failure leaves as an OpenAI error object."""
        rid = request_id_of(request)
        request[REQUEST_ID] = rid
        route = _ROUTE_LABELS.get(request.path) or _route_label(request.path)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = web.json_response(
                http_error_body(f"{request.method} {request.path}: {exc.reason}"),
                status=exc.status,
            )
        except ConnectionResetError:
            self.metrics.inc("client_disconnects")
            self.metrics.inc("requests", route, "499")
            raise asyncio.CancelledError() from None
        except asyncio.CancelledError:
            self.metrics.inc("client_disconnects")
            self.metrics.inc("requests", route, "499")
            raise
        except Exception as exc:
            reply = classify(exc, rid)
            if not isinstance(exc, RouterError):
                logger.exception("request failed", extra={"request_id": rid})
            elif reply.status >= 500:
                logger.warning("request failed: %s", reply.message, extra={"request_id": rid})
            response = web.json_response(reply.body(), status=reply.status, headers=reply.headers)
        if not response.prepared:
            response.headers[REQUEST_ID_HEADER] = rid
        self.metrics.inc("requests", route, str(response.status))
        return response

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._keys and request.path not in _OPEN_PATHS:
            given = request.headers.get("Authorization", "")
            token = given[7:].strip().encode() if given.lower().startswith("bearer ") else b""
            if not any(hmac.compare_digest(token, key) for key in self._keys):
                raise UnauthorizedError(
                    "missing or wrong API key: send 'Authorization: Bearer <key>'"
                )
        return await handler(request)

    # --- routes --------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.dispatcher.handle(request, "completion", request[REQUEST_ID])

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.dispatcher.handle(request, "chat", request[REQUEST_ID])

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, _: web.Request) -> web.Response:
        """Ready when at least one endpoint can serve a request end to end — or always, for a
        fleet that scales from zero: with no worker able to take a request it holds it while
        one starts (bounded by router.hold, then a 503 with Retry-After), so it must be sent
        requests even then (a Service sends none to a router that is not ready)."""
        picking = self.dispatcher.picking
        snapshot = picking.source.snapshot()
        routable = [e.id for e in snapshot.endpoints if e.routable and e.role in SERVING_ROLES]
        if routable:
            return web.json_response({"status": "ready", "endpoints": len(routable)})
        if picking.scales_from_zero:
            holding = "no worker serves yet: a request waits while one starts (scale from zero)"
            return web.json_response({"status": "ready", "endpoints": 0, "holding": holding})
        return web.json_response(
            {"status": "no routable decode or aggregated endpoint"}, status=503
        )

    async def render_metrics(self, _: web.Request) -> web.Response:
        body = await asyncio.to_thread(self.metrics.render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
