"""The diffusion routes: POST /v1/images/generations (OpenAI shape, b64 PNGs), the video job API
(POST /v1/videos -> 202, GET /v1/videos/{id}, GET /v1/videos/{id}/content -> MP4, DELETE).

Owns turning HTTP bodies into diffusion requests and outputs into responses; never maps errors to
statuses (errors.py does), never blocks the event loop (encoding runs on worker threads).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from aiohttp import web

from loom_runtime.diffusion.engine_types import DiffusionProgress
from loom_runtime.diffusion.types import DiffusionOutput, DiffusionRequest
from loom_runtime.serve.diffusion.media import images_reply, mp4_bytes, png_bytes, to_uint8
from loom_runtime.serve.diffusion.protocol import (
    SEED_MAX,
    ImageGenerationRequest,
    PromptEncoder,
    PromptSettings,
    VideoGenerationRequest,
    diffusion_requests,
    parse_media,
)
from loom_runtime.serve.diffusion.video_jobs import FINISHED, JobStore, VideoJob
from loom_runtime.serve.errors import EngineStalledError, JobNotReadyError, RequestAbortedError

logger = logging.getLogger(__name__)


class DiffusionSink(Protocol):
    """What the routes need of the engine (the DiffusionEngine satisfies it)."""

    @property
    def tokenizer(self) -> PromptEncoder: ...

    def add_request(
        self, req: DiffusionRequest, on_output: Callable[[DiffusionOutput], None]
    ) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def progress(self, request_id: str) -> DiffusionProgress | None: ...


@dataclass(frozen=True)
class DiffusionApiContext:
    engine: DiffusionSink
    prompts: PromptSettings
    jobs: JobStore
    image_timeout_s: float  # longest an image request waits for its images
    started: int  # unix time the worker started (the model's `created`)


DIFFUSION_CONTEXT = web.AppKey("diffusion_context", DiffusionApiContext)


def _seed(given: int | None) -> int:
    return secrets.randbelow(SEED_MAX) if given is None else given


async def images(request: web.Request) -> web.Response:
    ctx = request.app[DIFFUSION_CONTEXT]
    body = parse_media(ImageGenerationRequest, await request.read())
    base = f"img-{uuid.uuid4().hex}"
    ids = [f"{base}-{i}" for i in range(body.n)]
    reqs = diffusion_requests(body, ids, 1, _seed(body.seed), ctx.engine.tokenizer, ctx.prompts)
    event_loop = asyncio.get_running_loop()
    futures: dict[str, asyncio.Future[DiffusionOutput]] = {
        rid: event_loop.create_future() for rid in ids
    }

    def on_output(out: DiffusionOutput) -> None:  # the engine thread
        fut = futures[out.request_id]
        event_loop.call_soon_threadsafe(lambda: None if fut.done() else fut.set_result(out))

    added: list[str] = []
    try:
        for req in reqs:
            ctx.engine.add_request(req, on_output)
            added.append(req.request_id)
        try:
            outs = await asyncio.wait_for(asyncio.gather(*futures.values()), ctx.image_timeout_s)
        except TimeoutError:
            raise EngineStalledError(
                f"images {base}: not generated within {ctx.image_timeout_s:g} s"
            ) from None
    finally:
        for rid in added:  # a client that left, a timeout, a refused sibling: free them all
            fut = futures[rid]  # a cancelled gather cancels these: that is not an output
            if fut.cancelled() or not fut.done():
                ctx.engine.abort(rid)
    if any(o.finish_reason != "done" for o in outs):
        raise RequestAbortedError(f"images {base}: aborted by the worker; retry")
    pngs = await asyncio.to_thread(lambda: [png_bytes(to_uint8(o.frames)[0]) for o in outs])
    return web.json_response(images_reply(int(time.time()), pngs, [None] * len(pngs)))


async def create_video(request: web.Request) -> web.Response:
    ctx = request.app[DIFFUSION_CONTEXT]
    body = parse_media(VideoGenerationRequest, await request.read())
    job_id, seed, frames = f"video_{uuid.uuid4().hex}", _seed(body.seed), body.frames()
    [req] = diffusion_requests(body, [job_id], frames, seed, ctx.engine.tokenizer, ctx.prompts)
    job = VideoJob(
        id=job_id, model=ctx.prompts.model_name, created_at=int(time.time()), width=req.width,
        height=req.height, num_frames=frames, fps=body.fps, seed=seed,
    )  # fmt: skip
    ctx.jobs.add(job)  # 503 when full of unfinished jobs: nothing is in the engine yet
    event_loop = asyncio.get_running_loop()

    def on_output(out: DiffusionOutput) -> None:  # the engine thread: convert off the loop
        pixels = to_uint8(out.frames) if out.finish_reason == "done" else None
        event_loop.call_soon_threadsafe(_finished, ctx.jobs, job, pixels)

    try:
        ctx.engine.add_request(req, on_output)
    except Exception:
        ctx.jobs.remove(job_id)
        raise
    _refresh(ctx, job)
    return web.json_response(job.body(), status=202)


def _finished(jobs: JobStore, job: VideoJob, pixels: np.ndarray | None) -> None:
    """On the event loop: the engine's final output for a job."""
    if pixels is not None:
        job.frames, job.steps_done = pixels, job.steps_total
        jobs.finish(job.id, "completed")
    elif job.cancel_requested:
        jobs.finish(job.id, "cancelled")
    else:
        jobs.finish(job.id, "failed", "aborted by the worker (paused or shut down); retry")


def _refresh(ctx: DiffusionApiContext, job: VideoJob) -> None:
    """Copy the engine's progress into an unfinished job."""
    if job.status in FINISHED:
        return
    p = ctx.engine.progress(job.id)
    if p is not None:
        job.status, job.steps_done, job.steps_total = p.status, p.steps_done, p.steps_total


async def get_video(request: web.Request) -> web.Response:
    ctx = request.app[DIFFUSION_CONTEXT]
    job = ctx.jobs.get(request.match_info["video_id"])
    _refresh(ctx, job)
    return web.json_response(job.body())


async def video_content(request: web.Request) -> web.Response:
    ctx = request.app[DIFFUSION_CONTEXT]
    job = ctx.jobs.get(request.match_info["video_id"])
    if job.status != "completed":
        raise JobNotReadyError(
            f"video job {job.id!r} is {job.status}: its content exists once it is completed"
        )
    if job.mp4 is None:
        frames = job.frames
        assert frames is not None
        job.mp4 = await asyncio.to_thread(mp4_bytes, frames, job.fps)
        job.frames = None
    return web.Response(
        body=job.mp4,
        content_type="video/mp4",
        headers={"Content-Disposition": f'attachment; filename="{job.id}.mp4"'},
    )


async def delete_video(request: web.Request) -> web.Response:
    """Cancel an unfinished job (at the engine's next step boundary); delete a finished one."""
    ctx = request.app[DIFFUSION_CONTEXT]
    job = ctx.jobs.get(request.match_info["video_id"])
    if job.status in FINISHED:
        ctx.jobs.remove(job.id)
        return web.json_response({"id": job.id, "object": "video.deleted", "deleted": True})
    job.cancel_requested = True
    ctx.engine.abort(job.id)
    _refresh(ctx, job)
    return web.json_response({**job.body(), "cancel_requested": True})


def model_card(ctx: DiffusionApiContext) -> dict[str, Any]:
    """The served model as /v1/models lists it."""
    name = ctx.prompts.model_name
    return {"id": name, "object": "model", "created": ctx.started, "owned_by": "loom", "root": name}


async def models(request: web.Request) -> web.Response:
    card = model_card(request.app[DIFFUSION_CONTEXT])
    return web.json_response({"object": "list", "data": [card]})


def add_routes(app: web.Application, ctx: DiffusionApiContext, with_models: bool = True) -> None:
    """The image and video routes; `with_models` False leaves /v1/models to a worker serving
    more."""
    app[DIFFUSION_CONTEXT] = ctx
    app.router.add_post("/v1/images/generations", images)
    app.router.add_post("/v1/videos", create_video)
    app.router.add_get("/v1/videos/{video_id}", get_video)
    app.router.add_get("/v1/videos/{video_id}/content", video_content)
    app.router.add_delete("/v1/videos/{video_id}", delete_video)
    if with_models:
        app.router.add_get("/v1/models", models)
