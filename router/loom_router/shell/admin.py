"""The router's admin HTTP API (its own port, bearer token): list, register, replace, remove,
drain, undrain, mark down/up and migrate endpoints. `loom up`'s fleet and tests drive it.

    GET    /admin/endpoints
    PUT    /admin/endpoints/{id}   {"url", "role", "weights_version", "kv_events", "kv_replay"}
    DELETE /admin/endpoints/{id}
    POST   /admin/endpoints/{id}/drain | undrain | down | up | migrate

Owns the routes and the token check (the JSON is loom_runtime.wire.router_admin's, the
operator's client reads the same); never routes requests, and errors become statuses only
through loom_router.errors.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from loom_router.core.endpoints import Endpoint, StaticEndpoints
from loom_router.errors import (
    BadRequestError,
    EndpointError,
    RouterError,
    UnauthorizedError,
    classify,
    http_error_body,
)
from loom_router.shell.config import endpoint_from_doc
from loom_router.shell.prober import Prober
from loom_router.shell.transport import Flights
from loom_runtime.wire.router_admin import ENDPOINTS_PATH, OPS, EndpointRecord, endpoints_json

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def endpoint_record(endpoint: Endpoint, flights: Flights, prober: Prober) -> EndpointRecord:
    return EndpointRecord(
        id=endpoint.id,
        spec=endpoint.spec,
        ready=endpoint.ready,
        draining=endpoint.draining,
        down=endpoint.down,
        down_by_router=endpoint.id in prober.auto_down,
        in_flight=flights.count(endpoint.id),
    )


class AdminApp:
    def __init__(
        self, source: StaticEndpoints, flights: Flights, prober: Prober, token: str
    ) -> None:
        if not token:
            raise ValueError("the admin API needs a non-empty bearer token")
        self.source = source
        self.flights = flights
        self.prober = prober
        self._token = token.encode()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=1 << 20)
        app.router.add_get(ENDPOINTS_PATH, self.list)
        app.router.add_put(ENDPOINTS_PATH + "/{id}", self.put)
        app.router.add_delete(ENDPOINTS_PATH + "/{id}", self.delete)
        app.router.add_post(ENDPOINTS_PATH + "/{id}/{op}", self.op)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            given = request.headers.get("Authorization", "")
            token = given[7:].strip().encode() if given.lower().startswith("bearer ") else b""
            if not hmac.compare_digest(token, self._token):
                raise UnauthorizedError("admin API: missing or wrong bearer token")
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return web.json_response(
                http_error_body(f"{request.method} {request.path}: {exc.reason}"),
                status=exc.status,
            )
        except RouterError as exc:
            reply = classify(exc)
            return web.json_response(reply.body(), status=reply.status)

    def _json(self, endpoint: Endpoint) -> dict[str, Any]:
        return endpoint_record(endpoint, self.flights, self.prober).to_json()

    async def list(self, _: web.Request) -> web.Response:
        snapshot = self.source.snapshot()
        records = [endpoint_record(e, self.flights, self.prober) for e in snapshot.endpoints]
        return web.json_response(endpoints_json(snapshot.generation, records))

    async def put(self, request: web.Request) -> web.Response:
        """Register an endpoint, or replace one's address, role or version. A replaced one
        keeps its drain and admin-down state; one the router took down gets a fresh chance."""
        endpoint_id = request.match_info["id"]
        try:
            doc = await request.json()
        except ValueError:
            raise BadRequestError("the body must be a JSON object") from None
        endpoint = endpoint_from_doc(endpoint_id, doc, "body")
        current = self.source.snapshot().get(endpoint_id)
        if current is None:
            snap = self.source.add(endpoint)
            status = 201
        else:
            keep_down = current.down and endpoint_id not in self.prober.auto_down
            self.prober.admin_set(endpoint_id)
            merged = replace(endpoint, draining=current.draining, down=keep_down,
                             ready=current.ready)  # fmt: skip
            snap = self.source.update(merged)
            status = 200
        logger.info("endpoint registered", extra={"endpoint": endpoint_id, "url": endpoint.url,
                                                  "version": endpoint.weights_version})  # fmt: skip
        return web.json_response(self._json(snap.by_id[endpoint_id]), status=status)

    async def delete(self, request: web.Request) -> web.Response:
        endpoint_id = request.match_info["id"]
        self.source.remove(endpoint_id)
        self.prober.admin_set(endpoint_id)
        logger.info("endpoint removed", extra={"endpoint": endpoint_id})
        return web.json_response({"id": endpoint_id, "removed": True})

    async def op(self, request: web.Request) -> web.Response:
        endpoint_id = request.match_info["id"]
        op = request.match_info["op"]
        if op not in OPS:
            raise web.HTTPNotFound(reason=f"unknown operation {op!r}; use one of {OPS}")
        moved = 0
        if op == "drain":
            snap = self.source.drain(endpoint_id)
        elif op == "undrain":
            snap = self.source.undrain(endpoint_id)
        elif op == "down":
            snap = self.source.mark_down(endpoint_id)
            self.prober.admin_set(endpoint_id)
        elif op == "up":
            snap = self.source.mark_up(endpoint_id)
            self.prober.admin_set(endpoint_id)
        else:
            snap = self.source.snapshot()
            if snap.get(endpoint_id) is None:
                raise EndpointError(f"no endpoint {endpoint_id!r}")
            moved = self.flights.migrate(endpoint_id)
        logger.info("endpoint %s", op, extra={"endpoint": endpoint_id, "migrated": moved})
        body = self._json(snap.by_id[endpoint_id])
        if op == "migrate":
            body["migrated"] = moved
        return web.json_response(body)
