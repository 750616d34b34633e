"""The router's workflows: a request that names a workflow as its `model` runs the workflow's
stages in order, each a full request to its card's router (the last one to this router), the
text each stage returns prompting the next.

A workflow whose last stage is `images` answers POST /v1/images/generations when its last stage
does. One whose last stage is `videos` is a video job: POST /v1/videos answers 202 at once, the
stages run in the background, and GET /v1/videos/{id} shows each stage's record and, once the
last stage started, its video job's status; /content is that job's MP4.

Owns the stage calls and the table of workflow jobs; never decides what a stage is sent
(core/workflows.py) and never routes a stage's request to a worker (the stage's router does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import aiohttp
from aiohttp import web

from loom_router.core.workflows import (
    JOB_PREFIX,
    Stage,
    WorkflowJob,
    WorkflowRequest,
    WorkflowRoute,
    handed_on,
    parse_request,
    stage_body,
)
from loom_router.errors import BadRequestError, JobNotFoundError, Reply
from loom_router.shell.upstream import Upstream, UpstreamReply
from loom_runtime.wire.headers import REQUEST_ID_HEADER

logger = logging.getLogger(__name__)

IMAGES, VIDEOS = "/v1/images/generations", "/v1/videos"
STAGE_TIMEOUT_S = 900.0  # one stage's whole answer (an image is drawn before it is sent)
SMALL_CALL_S = 30.0
CONTENT_CALL_S = 300.0
MAX_JOBS = 1000  # workflow video jobs kept: finished, then handed-off ones make room; then a 429
JOB_TTL_S = 3600.0
_PASSED = ("authorization",)


class StageFailed(Exception):
    """A stage's request failed; `status` is the stage's 4xx, or 502 when it broke."""

    def __init__(self, why: str, status: int = 502) -> None:
        super().__init__(why)
        self.status = status


def _error(status: int, message: str, code: str) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response(Reply(status, kind, code, message).body(), status=status)


def _why(reply: UpstreamReply) -> str:
    doc = reply.json()
    error = doc.get("error") if isinstance(doc, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else None
    return f"{reply.status}: {message or reply.body[:200].decode(errors='replace')}"


class WorkflowProxy:
    """The workflows of one router."""

    def __init__(
        self,
        workflows: tuple[WorkflowRoute, ...],
        upstream: Upstream,
        own_url: str,
        stage_timeout_s: float = STAGE_TIMEOUT_S,
        max_jobs: int = MAX_JOBS,
    ) -> None:
        self.workflows = {w.name: w for w in workflows}
        self._upstream, self._own_url = upstream, own_url.rstrip("/")
        self._stage_timeout_s, self._max_jobs = stage_timeout_s, max_jobs
        self._jobs: OrderedDict[str, WorkflowJob] = OrderedDict()
        self._finished: dict[str, float] = {}  # job id -> when it was seen finished
        self._handed: dict[str, float] = {}  # job id -> when its last stage's job started
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def named(self, body: Mapping[str, Any]) -> WorkflowRoute | None:
        model = body.get("model")
        return self.workflows.get(model) if isinstance(model, str) else None

    @staticmethod
    def owns(job_id: str) -> bool:
        return job_id.startswith(JOB_PREFIX)

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- images: the whole workflow inside one request ----------------------------------------

    async def image(
        self, workflow: WorkflowRoute, body: Mapping[str, Any], request: web.Request, rid: str
    ) -> web.Response:
        wanted = _check(workflow, "images", body)
        job = WorkflowJob.new(workflow)

        def keep(new: WorkflowJob) -> None:
            nonlocal job
            job = new

        try:
            last = await self._run(job, wanted, _headers(request, rid), keep)
        except StageFailed as exc:
            return _error(exc.status, job.error or str(exc), "workflow_stage_failed")
        doc = dict(last.json())
        doc.update(model=workflow.name, stages=[s.doc() for s in job.stages])
        return web.json_response(doc)

    # --- videos: a job ------------------------------------------------------------------------

    async def create_video(
        self, workflow: WorkflowRoute, body: Mapping[str, Any], request: web.Request, rid: str
    ) -> web.Response:
        wanted = _check(workflow, "videos", body)
        if not self._room(time.monotonic()):
            return _error(429, f"{len(self._jobs)} workflow jobs are running here; retry later",
                          "too_many_workflow_jobs")  # fmt: skip
        job = WorkflowJob.new(workflow)
        self._jobs[job.id] = job
        headers = _headers(request, rid)
        task = asyncio.create_task(self._background(job, wanted, headers))
        self._tasks[job.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.id, None))
        return web.json_response(job.doc(), status=202)

    async def get_video(self, job_id: str, request: web.Request, rid: str) -> web.Response:
        job = self._job(job_id)
        return web.json_response(await self._polled(job, _headers(request, rid)))

    async def video_content(self, job_id: str, request: web.Request, rid: str) -> web.Response:
        job = self._job(job_id)
        doc = await self._polled(job, _headers(request, rid))
        if job.final_job_id is None or doc["status"] != "completed":
            message = f"workflow job {job_id} is {doc['status']}: poll it until it is completed"
            return _error(409, doc.get("error", {}).get("message", message), "not_ready")
        try:
            reply = await self._call("GET", f"{VIDEOS}/{job.final_job_id}/content",
                                     _headers(request, rid), CONTENT_CALL_S)  # fmt: skip
        except StageFailed as exc:
            return _error(502, f"workflow job {job_id}: {exc}", "upstream_failed")
        headers = {k: v for k, v in reply.headers.items() if k.lower() == "content-type"}
        if reply.status == 200:
            headers["Content-Disposition"] = f'attachment; filename="{job.id}.mp4"'
        return web.Response(status=reply.status, body=reply.body, headers=headers)

    async def delete_video(self, job_id: str, request: web.Request, rid: str) -> web.Response:
        job = self._job(job_id)
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        job = self._jobs.get(job_id, job)
        if job.final_job_id is not None:
            with contextlib.suppress(StageFailed):
                await self._call("DELETE", f"{VIDEOS}/{job.final_job_id}",
                                 _headers(request, rid), SMALL_CALL_S)  # fmt: skip
        self._forget(job_id)
        return web.json_response({"id": job_id, "object": "video.deleted", "deleted": True})

    # --- running stages -----------------------------------------------------------------------

    async def _background(
        self, job: WorkflowJob, wanted: WorkflowRequest, headers: Mapping[str, str]
    ) -> None:
        def keep(new: WorkflowJob) -> None:
            if new.id in self._jobs:
                self._jobs[new.id] = new
                if new.error is not None:
                    self._finished.setdefault(new.id, time.monotonic())
                elif new.final_job_id is not None:
                    self._handed.setdefault(new.id, time.monotonic())

        try:
            await self._run(job, wanted, headers, keep)
        except StageFailed:
            return  # the job says which stage failed, and why
        except asyncio.CancelledError:
            current = self._jobs.get(job.id)
            if current is not None:
                index = next((i for i, s in enumerate(current.stages)
                              if s.status in ("queued", "in_progress")), 0)  # fmt: skip
                keep(current.with_stage(index, status="cancelled"))
            raise

    async def _run(
        self,
        job: WorkflowJob,
        wanted: WorkflowRequest,
        headers: Mapping[str, str],
        keep: Callable[[WorkflowJob], None],
    ) -> UpstreamReply:
        """Every stage in order, each change of the job given to `keep`; the last stage's
        reply. StageFailed (after `keep` got the failed job) when a stage fails."""
        prompt = wanted.prompt
        reply: UpstreamReply | None = None
        for index, stage in enumerate(wanted.workflow.stages):
            job = job.with_stage(index, status="in_progress")
            keep(job)
            body = stage_body(wanted, stage, prompt)
            try:
                reply = await self._stage(stage, body, headers)
            except StageFailed as exc:
                keep(job.failed(index, str(exc)))
                logger.warning("workflow stage failed: %s", exc,
                               extra={"workflow": job.workflow, "stage": stage.name})  # fmt: skip
                raise
            if stage.route == "images":
                prompt, kept = handed_on(reply.json(), prompt)
                if index == len(wanted.workflow.stages) - 1:
                    kept.pop("b64_json", None)  # the answer's own data carries it
                job = job.with_stage(index, status="completed", output=kept)
            else:
                final = str(reply.json()["id"])
                job = replace(job.with_stage(index, output={"video_id": final}),
                              final_job_id=final)  # fmt: skip
            keep(job)
        assert reply is not None, "a workflow has stages"
        return reply

    async def _stage(
        self, stage: Stage, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> UpstreamReply:
        path, ok = (IMAGES, 200) if stage.route == "images" else (VIDEOS, 202)
        url = (stage.url or self._own_url) + path
        try:
            async with self._upstream.session.post(
                url, json=body, headers=dict(headers),
                timeout=aiohttp.ClientTimeout(total=self._stage_timeout_s),
            ) as resp:  # fmt: skip
                reply = UpstreamReply(resp.status, dict(resp.headers), await resp.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise StageFailed(f"{url} did not answer: {exc or type(exc).__name__}") from None
        doc = reply.json()
        if reply.status != ok or not isinstance(doc, Mapping):
            raise StageFailed(_why(reply), reply.status if 400 <= reply.status < 500 else 502)
        if stage.route == "videos" and not isinstance(doc.get("id"), str):
            raise StageFailed(f"{url} answered 202 without a job id")
        return reply

    async def _polled(self, job: WorkflowJob, headers: Mapping[str, str]) -> dict[str, Any]:
        """The job's document, with its last stage's video job polled once it started."""
        if job.final_job_id is None or job.error is not None:
            return job.doc()
        try:
            reply = await self._call("GET", f"{VIDEOS}/{job.final_job_id}", headers, SMALL_CALL_S)
        except StageFailed as exc:
            return job.doc() | {"status": "in_progress", "note": str(exc)}
        doc = reply.json()
        final = doc if reply.status == 200 and isinstance(doc, Mapping) else None
        if final is None:
            job = job.failed(len(job.stages) - 1, _why(reply))
        else:
            status = str(final.get("status"))
            error = final.get("error")
            if status == "failed":
                why = error.get("message") if isinstance(error, Mapping) else "its video job failed"
                job = job.failed(len(job.stages) - 1, str(why))
            elif status in ("queued", "in_progress", "completed", "cancelled"):
                job = job.with_stage(len(job.stages) - 1, status=status)
        if job.id not in self._jobs:
            return job.doc(final)  # forgotten (deleted) while this poll ran
        self._jobs[job.id] = job
        if job.status in ("completed", "failed", "cancelled"):
            self._handed.pop(job.id, None)
            self._finished.setdefault(job.id, time.monotonic())
        return job.doc(final)

    async def _call(
        self, method: str, path: str, headers: Mapping[str, str], timeout_s: float
    ) -> UpstreamReply:
        """A bodiless request to this router (the last stage's video job)."""
        try:
            async with self._upstream.session.request(
                method, self._own_url + path, headers=dict(headers),
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:  # fmt: skip
                return UpstreamReply(resp.status, dict(resp.headers), await resp.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise StageFailed(f"this router did not answer: {exc or type(exc).__name__}") from None

    # --- the table ----------------------------------------------------------------------------

    def _job(self, job_id: str) -> WorkflowJob:
        self._expire(time.monotonic())
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(
                f"workflow job {job_id!r} is not known here: it was never created through this "
                "router, was deleted, or finished more than an hour ago"
            )
        return job

    def _room(self, now: float) -> bool:
        """Whether a new job fits, forgetting to make room the oldest finished jobs, then the
        oldest whose stages all ran (the video job of their last stage goes on without them,
        in the router's own job table); never a job whose stages still run."""
        self._expire(now)
        for done in (self._finished, self._handed):
            while len(self._jobs) >= self._max_jobs and done:
                self._forget(min(done, key=done.__getitem__))
        return len(self._jobs) < self._max_jobs

    def _expire(self, now: float) -> None:
        for job_id, at in list(self._finished.items()):
            if now - at > JOB_TTL_S:
                self._forget(job_id)

    def _forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)
        self._finished.pop(job_id, None)
        self._handed.pop(job_id, None)


def _check(workflow: WorkflowRoute, route: str, body: Mapping[str, Any]) -> WorkflowRequest:
    if workflow.route != route:
        other = IMAGES if workflow.route == "images" else VIDEOS
        raise BadRequestError(f"model: workflow {workflow.name} is served on {other}", "model")
    return parse_request(body, workflow)


def own_url(host: str, port: int) -> str:
    """This router's base URL for its own stages (a wildcard listen address: loopback)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _headers(request: web.Request, rid: str) -> dict[str, str]:
    headers = {k: v for k, v in request.headers.items() if k.lower() in _PASSED}
    headers[REQUEST_ID_HEADER] = rid
    return headers
