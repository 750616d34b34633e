"""The workflow proxy's own parts: the URL a router calls itself on, and its bounded job table
(finished jobs make room; then a new job is a 429, never an unbounded table). Workflows end to end
run in tests/operator/local/test_up_workflow.py (two real fleets)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from aiohttp import web

from loom_router.core.workflows import Stage, WorkflowRoute
from loom_router.shell.upstream import Upstream, UpstreamTimeouts
from loom_router.shell.workflow_proxy import WorkflowProxy, own_url


def test_a_router_calls_itself_on_loopback_when_it_listens_everywhere() -> None:
    assert own_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert own_url("10.0.0.7", 8000) == "http://10.0.0.7:8000"
    assert own_url("::", 8000) == "http://127.0.0.1:8000"
    assert own_url("fd00::7", 8000) == "http://[fd00::7]:8000"


class _Request(dict[str, Any]):
    headers: ClassVar[dict[str, str]] = {"Authorization": "Bearer k", "Cookie": "no"}


def _flow(url: str) -> WorkflowRoute:
    return WorkflowRoute("story", (Stage("think", "mot", "images", url),
                                   Stage("animate", "wan", "videos", None)))  # fmt: skip


async def _statuses(url: str) -> list[Any]:
    """Jobs of a 2-job table: two whose first stage fails at once, a third that takes the room
    of a finished one; then (first stage answering never) two running jobs and a 429."""
    upstream = Upstream(UpstreamTimeouts(connect_s=0.5))
    await upstream.start()
    out: list[Any] = []
    body = {"model": "story", "prompt": "p"}
    for stage_url in ("http://127.0.0.1:9", url):
        flow = _flow(stage_url)
        proxy = WorkflowProxy((flow,), upstream, "http://127.0.0.1:9", max_jobs=2)
        try:
            for _ in range(3):
                reply = await proxy.create_video(flow, body, _Request(), "r")  # type: ignore[arg-type]
                out.append(reply.status)
                await asyncio.sleep(0.3)
            out.append(sorted(j.status for j in proxy._jobs.values()))
        finally:
            await proxy.close()
    await upstream.close()
    return out


def test_the_job_table_is_bounded() -> None:
    async def run() -> list[Any]:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await _statuses(f"http://127.0.0.1:{port}")
        finally:
            server.close()

    assert asyncio.run(run()) == [
        202, 202, 202, ["failed", "failed"],
        202, 202, 429, ["in_progress", "in_progress"],
    ]  # fmt: skip


def test_jobs_whose_stages_all_ran_make_room_before_a_429() -> None:
    """A stand-in stage router (an aiohttp app answering like one: an image with a thought, a
    202 video job) runs every stage at once; those jobs make room for new ones."""

    async def images(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"b64_json": "PNG", "revised_prompt": "t"}]})

    async def videos(_: web.Request) -> web.Response:
        return web.json_response({"id": "video_1", "status": "queued"}, status=202)

    async def run() -> list[Any]:
        app = web.Application()
        app.router.add_post("/v1/images/generations", images)
        app.router.add_post("/v1/videos", videos)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        upstream = Upstream(UpstreamTimeouts(connect_s=0.5))
        await upstream.start()
        flow = _flow(url)
        proxy = WorkflowProxy((flow,), upstream, url, max_jobs=2)
        out: list[Any] = []
        try:
            for _ in range(3):
                body = {"model": "story", "prompt": "p"}
                reply = await proxy.create_video(flow, body, _Request(), "r")  # type: ignore[arg-type]
                out.append(reply.status)
                await asyncio.sleep(0.3)
            out.append([(j.final_job_id, j.stages[0].output) for j in proxy._jobs.values()])
        finally:
            await proxy.close()
            await upstream.close()
            await runner.cleanup()
        return out

    handed = ("video_1", {"revised_prompt": "t", "b64_json": "PNG"})
    assert asyncio.run(run()) == [202, 202, 202, [handed, handed]]
