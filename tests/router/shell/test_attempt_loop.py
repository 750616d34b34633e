"""The attempt loop's pure parts and the transport's registry: which failures move a request,
what the migration header says, and the registry an admin's migrate acts on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from loom_router.core.endpoints import Endpoint, StaticEndpoints
from loom_router.core.settings import RoutingSettings
from loom_router.core.state import RouterState
from loom_router.shell.attempt_loop import _migrated, _movable
from loom_router.shell.dispatch import Dispatcher
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.picking import Picking
from loom_router.shell.prober import Prober
from loom_router.shell.proxy import ProxyApp
from loom_router.shell.transport import Flights, Transport
from loom_router.shell.upstream import Upstream, UpstreamTimeouts


def test_only_worker_side_aborts_move_a_stream() -> None:
    assert _movable({"error": {"code": "request_aborted"}})
    assert _movable({"error": {"code": "engine_stalled"}})
    assert not _movable({"error": {"code": "kv_transfer_failed"}})  # policy "fail": an answer
    assert not _movable({"error": {"code": None, "type": "invalid_request_error"}})


def test_the_header_says_when_a_request_restarted_on_another_version() -> None:
    a = Endpoint("a", "http://a", "decode", "v1")
    b = Endpoint("b", "http://b", "decode", "v1")
    c = Endpoint("c", "http://c", "decode", "v2")
    assert _migrated(a, b, "refused") == "from a: refused"
    assert _migrated(a, c, "refused").endswith("restarted from the prompt on weights version v2")


def test_migrate_moves_every_flight_of_the_endpoint_and_only_those() -> None:
    flights = Flights()
    mine = [flights.add("a"), flights.add("a")]
    other = flights.add("b")
    assert flights.migrate("a") == 2 and all(f.moved for f in mine) and not other.moved
    for f in mine:
        flights.remove(f)
    assert flights.count("a") == 0 and flights.count("b") == 1


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@asynccontextmanager
async def _router(source: StaticEndpoints, migration_limit: int) -> AsyncIterator[str]:
    """A router app over `source` (no tokenizer), served on a free port: its URL."""
    state = RouterState(RoutingSettings(migration_limit=migration_limit, session_affinity=False))
    state.on_endpoints(source.snapshot())
    upstream = Upstream(UpstreamTimeouts())
    await upstream.start()
    metrics = RouterMetrics()
    prober = Prober(source, upstream, metrics)
    picking = Picking(source=source, state=state, upstream=upstream, metrics=metrics)
    dispatcher = Dispatcher(
        state=state, picking=picking, upstream=upstream,
        transport=Transport(upstream, prober, metrics, state.load), metrics=metrics,
        prober=prober, tokenizer=None,
    )  # fmt: skip
    runner, url = await _serve(ProxyApp(dispatcher, metrics, "m").app())
    try:
        yield url
    finally:
        await runner.cleanup()
        await upstream.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_that_runs_out_of_migrations_gets_the_routers_own_502(stream: bool) -> None:
    """Every worker answers 503 (paused): after failover.migrationLimit moves, streamed and
    non-streamed requests alike get the router's 502 migration_failed, not a worker's 503."""

    async def scenario() -> tuple[int, dict[str, Any], list[str]]:
        tried: list[str] = []

        async def paused(request: web.Request) -> web.Response:
            tried.append(request.headers.get("x-request-id", ""))
            body = {"error": {"message": "paused", "type": "x", "code": "admission_closed"}}
            return web.json_response(body, status=503)

        worker = web.Application()
        worker.router.add_post("/v1/completions", paused)
        worker_runner, url = await _serve(worker)
        source = StaticEndpoints([Endpoint(i, url, "aggregated", "v1") for i in ("a", "b", "c")])
        try:
            async with (
                _router(source, migration_limit=1) as router_url,
                aiohttp.ClientSession() as client,
            ):
                body = {"model": "m", "prompt": "hello", "max_tokens": 4, "stream": stream}
                async with client.post(router_url + "/v1/completions", json=body) as resp:
                    return resp.status, await resp.json(), tried
        finally:
            await worker_runner.cleanup()

    status, answer, tried = asyncio.run(scenario())
    assert status == 502
    assert answer["error"]["code"] == "migration_failed"
    assert "failover.migrationLimit 1 reached" in answer["error"]["message"]
    assert len(tried) == 2  # the first worker, then one move


def _chunk(index: int, text: str) -> bytes:
    choice = {"index": index, "text": text, "logprobs": None, "finish_reason": None}
    event = {"id": "c", "object": "text_completion", "created": 0, "model": "m",
             "choices": [choice]}  # fmt: skip
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _stream_through_router(broken: set[str]) -> tuple[int, list[dict[str, Any]], list[str]]:
    """A stream of two prompts through a router over workers a, b (same stub): a worker whose
    id is in `broken` sends one chunk and drops the connection; the others send both choices.
    The events the client read, and which workers were tried."""

    async def scenario() -> tuple[int, list[dict[str, Any]], list[str]]:
        tried: list[str] = []

        async def worker_handler(request: web.Request) -> web.StreamResponse:
            me = request.match_info["me"]
            tried.append(me)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(_chunk(1, "b"))
            if me in broken:
                assert request.transport is not None
                request.transport.close()
                return resp
            await resp.write(_chunk(0, "a") + b"data: [DONE]\n\n")
            return resp

        worker = web.Application()
        worker.router.add_post("/{me}/v1/completions", worker_handler)
        worker_runner, url = await _serve(worker)
        source = StaticEndpoints([Endpoint(i, f"{url}/{i}", "aggregated", "v1") for i in "ab"])
        try:
            async with (
                _router(source, migration_limit=2) as router_url,
                aiohttp.ClientSession() as client,
            ):
                body = {"model": "m", "prompt": ["x", "y"], "max_tokens": 4, "stream": True}
                async with client.post(router_url + "/v1/completions", json=body) as resp:
                    events = [json.loads(line[6:]) async for line in resp.content
                              if line.startswith(b"data: {")]  # fmt: skip
                    return resp.status, events, tried
        finally:
            await worker_runner.cleanup()

    return asyncio.run(scenario())


def test_a_stream_of_several_prompts_is_relayed_with_each_index() -> None:
    status, events, tried = _stream_through_router(set())
    assert status == 200 and len(tried) == 1
    assert [(e["choices"][0]["index"], e["choices"][0]["text"]) for e in events] == [
        (1, "b"),
        (0, "a"),
    ]


def test_a_stream_of_several_prompts_that_breaks_mid_stream_ends_with_a_clear_error() -> None:
    status, events, tried = _stream_through_router({"a", "b"})
    assert status == 200 and len(tried) == 1  # the client had a chunk: no second worker
    assert events[0]["choices"][0]["text"] == "b"
    error = events[-1]["error"]
    assert error["code"] == "migration_failed" and "several choices" in error["message"]
