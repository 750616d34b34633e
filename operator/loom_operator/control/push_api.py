"""The weight-push API a trainer opens a push with and follows it by: POST
/v1/weights/updates, GET /v1/weights/updates[/{id}], each behind its fleet's admin token —
one fleet at the root (`loom up`'s controller), or each DeploymentCard under
/cards/{namespace}/{name} (the operator, docs/rl.md).

Owns the HTTP shape and the token check; never decides whether a push may open (the
coordinator and fleet/push.py do) and never blocks the event loop it serves from.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from loom_operator.fleet.push import PushConflict, PushUpdate

Store = tuple[str, int]
Opener = Callable[[str, str, float, str, Store | None], PushUpdate]
"""(version, mode, timeout_s, kv, the trainer's TCPStore or None) -> the opened push, or
PushConflict."""
MAX_TIMEOUT_S = 3600.0
CARD_PREFIX = "/cards/{namespace}/{name}"


@dataclass(frozen=True)
class PushDesk:
    """One fleet as the API serves it."""

    token: str
    """The fleet's admin token: a request must carry it as its bearer token."""
    open: Opener
    latest: Callable[[], PushUpdate | None]
    store_required: bool = False
    """The trainer must say where its TCPStore listens (the controller cannot pick a port on the
    trainer's machine: on Kubernetes it is another machine)."""


@dataclass(frozen=True)
class Forward:
    """The fleet is another replica's (a sharded operator): its push API's base URL."""

    url: str


@dataclass(frozen=True)
class Later:
    """The card is known but its desk cannot be reached yet (a shard moving between replicas):
    answered 503 with Retry-After, which the trainer's client waits out."""

    why: str


RETRY_AFTER_S = 1
Desks = Callable[[Mapping[str, str]], Awaitable[PushDesk | Forward | Later | str]]
"""The route's match info ({namespace, name}, or nothing at the root) -> the fleet's desk, the
replica to forward to, a wait, or why there is none here (answered 404)."""
FORWARDED = "X-Loom-Forwarded"
"""Set on a forwarded request: the replica it reaches answers it itself (no second hop)."""
FORWARD_TIMEOUT_S = 30.0


def _error(status: int, message: str) -> web.Response:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return web.json_response({"error": message}, status=status, headers=headers)


def parse_store(text: object) -> Store:
    """A store address, host:port (an IPv6 host in brackets), as (host, port); ValueError says
    what is wrong."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"store_address must be host:port, got {text!r}")
    return host.strip("[]"), int(port)


def push_app(desks: Desks, prefix: str = "") -> web.Application:
    """The API as an aiohttp application; `prefix` "" serves one fleet, CARD_PREFIX a fleet
    per card."""

    async def desk_of(request: web.Request) -> PushDesk | web.Response:
        desk = await desks(request.match_info)
        if isinstance(desk, Forward):
            if request.headers.get(FORWARDED):
                desk = Later("the replica that holds the card's shard does not run it (its "
                             "shard moved a moment ago); retry shortly")  # fmt: skip
            else:
                return await forward(request, desk.url)
        if isinstance(desk, Later):
            return _error(503, desk.why)
        if isinstance(desk, str):
            return _error(404, desk)
        given = request.headers.get("Authorization", "").encode()
        if not desk.token or not hmac.compare_digest(given, f"Bearer {desk.token}".encode()):
            return _error(401, "missing or wrong token: use the fleet's admin token")
        return desk

    async def post(request: web.Request) -> web.Response:
        desk = await desk_of(request)
        if isinstance(desk, web.Response):
            return desk
        try:
            doc = json.loads(await request.read())
            version, mode = str(doc["version"]), str(doc.get("mode", "barrier"))
            timeout = float(doc.get("timeout_seconds", 60.0))
            kv = str(doc.get("kv") or ("keep" if mode == "keep" else ""))
            address = doc.get("store_address")
            store = None if address is None else parse_store(address)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return _error(
                400, f"a push needs JSON {{version, mode, timeout_seconds, kv, store_address}}: "
                f"{exc}",
            )  # fmt: skip
        if not 0 < timeout <= MAX_TIMEOUT_S:
            return _error(400, f"timeout_seconds must be in (0, {MAX_TIMEOUT_S:g}]")
        if store is None and desk.store_required:
            return _error(
                400, "store_address is required here: the host:port the workers reach the "
                "trainer's TCPStore at (WeightSync.connect(..., store_host=...))",
            )  # fmt: skip
        try:
            update = desk.open(version, mode, timeout, kv, store)
        except PushConflict as exc:
            return _error(409, str(exc))
        return web.json_response(update.as_json(), status=201)

    async def latest(request: web.Request) -> web.Response:
        desk = await desk_of(request)
        if isinstance(desk, web.Response):
            return desk
        u = desk.latest()
        return web.json_response({"update": None if u is None else u.as_json()})

    async def one(request: web.Request) -> web.Response:
        desk = await desk_of(request)
        if isinstance(desk, web.Response):
            return desk
        u, update_id = desk.latest(), request.match_info["update_id"]
        if u is None or u.update_id != update_id:
            return _error(404, f"no push {update_id} (only the latest is kept)")
        return web.json_response(u.as_json())

    app = web.Application()
    app.router.add_post(f"{prefix}/v1/weights/updates", post)
    app.router.add_get(f"{prefix}/v1/weights/updates", latest)
    app.router.add_get(f"{prefix}/v1/weights/updates/{{update_id}}", one)
    return app


async def forward(request: web.Request, base: str) -> web.Response:
    """Send `request` on to the replica at `base` and relay its answer (502 if it gives none)."""
    headers = {"Authorization": request.headers.get("Authorization", ""), FORWARDED: "1",
               "Content-Type": "application/json"}  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(
                request.method,
                base.rstrip("/") + request.path_qs,
                data=await request.read(),
                headers=headers,
            ) as answer,  # fmt: skip
        ):
            body = await answer.read()
            return web.Response(body=body, status=answer.status, content_type="application/json")
    except (aiohttp.ClientError, TimeoutError) as exc:
        return _error(502, f"the replica that holds the card's shard ({base}) did not answer: "
                      f"{exc or type(exc).__name__}")  # fmt: skip


async def start_push_api(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve `app` on host:port; the caller cleans the runner up."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
