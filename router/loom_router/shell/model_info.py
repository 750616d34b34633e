"""What the router answers about the served model itself: /v1/models (with the fleet's
max_model_len, as vLLM lists it) and vLLM's /tokenize and /detokenize, forwarded to a worker.

Owns those routes; never routes generation requests (dispatch.py does) and never tokenizes
itself (a worker answers, so the ids are the ones it would run).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from loom_router.core.body_check import parse_body
from loom_router.core.endpoints import Endpoint
from loom_router.core.filters import SERVING_ROLES
from loom_router.errors import NoEndpointError
from loom_router.shell.picking import Picking
from loom_router.shell.upstream import Upstream
from loom_runtime.wire.headers import REQUEST_ID_HEADER

TOKENIZE_TIMEOUT_S = 30.0


class ModelInfo:
    """The model's routes over the fleet `picking` sees."""

    def __init__(
        self,
        picking: Picking,
        upstream: Upstream,
        model_name: str,
        request_id: web.RequestKey[str],
        workflows: tuple[str, ...] = (),
    ) -> None:
        self.picking = picking
        self.upstream = upstream
        self.model_name = model_name
        self.workflows = workflows
        """Listed beside the model (root: the workflow itself; it spans several models)."""
        self._request_id = request_id  # the proxy's request key: the id its middleware set
        self._created = int(time.time())

    def add_routes(self, app: web.Application, tokenize: bool = True) -> None:
        app.router.add_get("/v1/models", self.models)
        if tokenize:
            app.router.add_post("/tokenize", self.forward)
            app.router.add_post("/detokenize", self.forward)

    def _serving(self) -> list[Endpoint]:
        endpoints = self.picking.source.snapshot().endpoints
        return [e for e in endpoints if e.routable and e.role in SERVING_ROLES]

    async def max_model_len(self) -> int | None:
        """The longest context every serving worker takes (their smallest), None when no
        serving worker has said yet."""
        lengths = [await self.picking.max_model_len(e) for e in self._serving()]
        known = [n for n in lengths if n is not None]
        return min(known) if known else None

    async def models(self, _: web.Request) -> web.Response:
        card: dict[str, Any] = {"id": self.model_name, "object": "model",
                                "created": self._created, "owned_by": "loom",
                                "root": self.model_name}  # fmt: skip
        max_len = await self.max_model_len()
        if max_len is not None:
            card["max_model_len"] = max_len
        flows = [{"id": name, "object": "model", "created": self._created, "owned_by": "loom",
                  "root": name, "loom_kind": "workflow"} for name in self.workflows]  # fmt: skip
        return web.json_response({"object": "list", "data": [card, *flows]})

    async def forward(self, request: web.Request) -> web.Response:
        """The body to one serving worker, its answer back as it is."""
        body: Mapping[str, Any] = parse_body(await request.read())
        serving = self._serving()
        if not serving:
            raise NoEndpointError(f"no routable decode or aggregated worker for {request.path}")
        endpoint = min(serving, key=lambda e: e.id)
        headers = {REQUEST_ID_HEADER: request[self._request_id]}
        reply = await self.upstream.post(endpoint, request.path, body, headers, TOKENIZE_TIMEOUT_S)
        return web.Response(body=reply.body, status=reply.status, content_type="application/json")
