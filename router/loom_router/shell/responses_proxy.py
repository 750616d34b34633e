"""The router's /v1/responses routes: a response goes to a worker picked as a chat request would
be (its instructions and input as the messages), or, continuing a stored response
(`previous_response_id`), to the worker that stores it; GET /v1/responses/{id} too. The answer
is relayed byte for byte (the Responses events with their names); a worker that fails before
the client has a byte is replaced once per migration allowed, never for a continued response
(no other worker has its history).

Owns those two routes and learning where responses live; never parses the events beyond the
first (which names the response) and never runs P/D (a response is prefilled where it decodes).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from loom_router.core.endpoints import Endpoint
from loom_router.core.request import RequestFeatures
from loom_router.core.response_owners import ResponseOwners
from loom_router.errors import (
    BadRequestError,
    MigrationFailedError,
    NoEndpointError,
    ResponseNotFoundError,
)
from loom_router.shell.dispatch import Dispatcher
from loom_router.shell.transport import AttemptFailed
from loom_runtime.wire.headers import ENDPOINT_HEADER, REQUEST_ID_HEADER

logger = logging.getLogger(__name__)
PATH = "/v1/responses"


def as_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The messages a response's prompt starts with, for picking (prefix-aware) only."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping) and isinstance(item.get("role"), str):
            content = item.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
            messages.append({"role": item["role"], "content": content})
    return {"model": body.get("model"), "messages": messages or [{"role": "user", "content": ""}]}


def response_id(data: bytes, sse: bool) -> str | None:
    """The id a worker's answer names: the whole response's, or the first event's."""
    try:
        if sse:
            first = data.split(b"\n\n", 1)[0]
            line = next(x for x in first.split(b"\n") if x.startswith(b"data:"))
            event = json.loads(line[5:])
            value = event.get("response", {}).get("id")
        else:
            value = json.loads(data).get("id")
    except (ValueError, StopIteration, AttributeError):
        return None
    return value if isinstance(value, str) else None


class ResponsesProxy:
    def __init__(self, dispatcher: Dispatcher, owners: ResponseOwners | None = None) -> None:
        self.dispatcher = dispatcher
        self.owners = owners or ResponseOwners()

    def add_routes(self, app: web.Application, request_id: web.RequestKey[str]) -> None:
        self._rid = request_id
        app.router.add_post(PATH, self.create)
        app.router.add_get(PATH + "/{response_id}", self.retrieve)

    def _pinned(self, features: RequestFeatures, response: str) -> Endpoint:
        """The worker that stores `response`, if it still serves; ResponseNotFoundError
        otherwise."""
        owner = self.owners.owner(response)
        if owner is not None:
            try:
                return self.dispatcher.picking.pin(features, owner)
            except NoEndpointError as exc:
                raise ResponseNotFoundError(
                    f"response {response!r} is stored on worker {owner}, which no longer "
                    f"serves ({exc}); start the conversation again"
                ) from exc
        raise ResponseNotFoundError(
            f"response {response!r} is not known to this router (never answered through it, "
            "sent with store false, or forgotten): start the conversation again"
        )

    async def create(self, request: web.Request) -> web.StreamResponse:
        rid = request[self._rid]
        try:
            body = await request.json()
        except ValueError:
            raise BadRequestError("the body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequestError("the body must be a JSON object")
        d = self.dispatcher
        features, _ = d.features(rid, "chat", as_chat(body), None)
        previous = body.get("previous_response_id")
        if isinstance(previous, str):
            endpoint, moves = self._pinned(features, previous), d.settings.migration_limit
        else:
            endpoint, moves = (await d.picking.pick_waiting(features)).endpoint, 0
        exclude: set[str] = set()
        while True:
            try:
                return await self._relay(request, endpoint, body, rid)
            except AttemptFailed as failure:
                moves += 1
                exclude.add(endpoint.id)
                if moves > d.settings.migration_limit:
                    raise MigrationFailedError(
                        f"worker {endpoint.id} failed ({failure}) before answering; "
                        + (
                            "a continued response lives on it alone"
                            if previous
                            else "failover.migrationLimit reached"
                        )
                    ) from failure
                endpoint = d.picking.repick(features, exclude, None)

    async def _relay(
        self, request: web.Request, endpoint: Endpoint, body: Mapping[str, Any], rid: str
    ) -> web.StreamResponse:
        """The worker's answer to the client; AttemptFailed while the client has nothing yet.
        A stream that breaks after its first byte ends with an `error` event: it cannot move."""
        transport = self.dispatcher.attempts.transport
        resp: web.StreamResponse | None = None
        try:
            async with transport.attempt(endpoint, PATH, body, {REQUEST_ID_HEADER: rid}) as up:
                headers = {k: v for k, v in up.headers.items() if k.startswith("x-loom-")}
                headers[ENDPOINT_HEADER] = endpoint.id
                if not up.is_sse:
                    data = await up.read_all()
                    if up.status == 200 and (found := response_id(data, False)) is not None:
                        self.owners.learn(found, endpoint.id)
                    reply = web.Response(status=up.status, body=data, headers=headers)
                    reply.content_type = "application/json"
                    return reply
                resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})  # fmt: skip
                head: bytes | None = b""  # until the first event, which names the response
                async for chunk in up.raw():
                    if not resp.prepared:
                        await resp.prepare(request)
                    if head is not None:
                        head += chunk
                        if b"\n\n" in head:
                            if (found := response_id(head, True)) is not None:
                                self.owners.learn(found, endpoint.id)
                            head = None
                    await resp.write(chunk)
        except AttemptFailed as failure:
            if resp is None or not resp.prepared:
                raise
            error = {"type": "error", "code": "migration_failed", "param": None,
                     "message": f"worker {endpoint.id} failed mid-stream ({failure}); a "
                                "response stream cannot resume on another worker"}  # fmt: skip
            await resp.write(f"event: error\ndata: {json.dumps(error)}\n\n".encode())
        assert resp is not None
        if not resp.prepared:
            await resp.prepare(request)
        await resp.write_eof()
        return resp

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        rid = request[self._rid]
        response = request.match_info["response_id"]
        features = RequestFeatures(rid, 0)
        endpoint = self._pinned(features, response)
        status, text = await self.dispatcher.upstream.get(f"{endpoint.url}{PATH}/{response}", 10.0)
        reply = web.Response(status=status, text=text, headers={ENDPOINT_HEADER: endpoint.id})
        reply.content_type = "application/json"
        return reply
