"""The `loom up` controller's weight-push API, where a trainer opens a push and follows it:
POST /v1/weights/updates, GET /v1/weights/updates[/{id}], behind the fleet's admin token.

Owns the HTTP shape and the token check; never decides whether a push may open (the
coordinator and fleet/push.py do) and never blocks the controller's loop.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable

from aiohttp import web

from loom_operator.fleet.push import PushConflict, PushUpdate

Opener = Callable[[str, str, float, str], PushUpdate]
"""(version, mode, timeout_s, kv) -> the opened push, or PushConflict."""
MAX_TIMEOUT_S = 3600.0


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def push_app(
    token: str, open_push: Opener, current: Callable[[], PushUpdate | None]
) -> web.Application:
    """The API as an aiohttp application (the controller serves it on its own port)."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def auth(request: web.Request, handler: Callable[..., object]) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return _error(401, "missing or wrong token: use the fleet's admin token")
        response = await handler(request)  # type: ignore[misc]
        assert isinstance(response, web.StreamResponse)
        return response

    async def post(request: web.Request) -> web.Response:
        try:
            doc = json.loads(await request.read())
            version, mode = str(doc["version"]), str(doc.get("mode", "barrier"))
            timeout = float(doc.get("timeout_seconds", 60.0))
            kv = str(doc.get("kv") or ("keep" if mode == "keep" else ""))
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"a push needs JSON {{version, mode, timeout_seconds, kv}}: {exc}")
        if not 0 < timeout <= MAX_TIMEOUT_S:
            return _error(400, f"timeout_seconds must be in (0, {MAX_TIMEOUT_S:g}]")
        try:
            update = open_push(version, mode, timeout, kv)
        except PushConflict as exc:
            return _error(409, str(exc))
        return web.json_response(update.as_json(), status=201)

    async def latest(request: web.Request) -> web.Response:
        u = current()
        return web.json_response({"update": None if u is None else u.as_json()})

    async def one(request: web.Request) -> web.Response:
        u = current()
        if u is None or u.update_id != request.match_info["update_id"]:
            return _error(
                404, f"no push {request.match_info['update_id']} (only the latest is kept)"
            )
        return web.json_response(u.as_json())

    app = web.Application(middlewares=[auth])
    app.router.add_post("/v1/weights/updates", post)
    app.router.add_get("/v1/weights/updates", latest)
    app.router.add_get("/v1/weights/updates/{update_id}", one)
    return app


async def start_push_api(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve `app` on host:port; the caller cleans the runner up."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
