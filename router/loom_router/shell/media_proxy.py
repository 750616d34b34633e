"""The router's image and video routes: POST /v1/images/generations and the video job API, sent to
the diffusion worker with the least predicted work, retried or restarted from the request's seed
when a worker is lost.

Owns the attempt loop of a media request and the mapping of the router's job ids onto workers';
never decides costs or picks (core/media_cost.py) and never keeps the job table's rules
(core/media_jobs.py).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from loom_router.core.endpoints import Endpoint, StaticEndpoints
from loom_router.core.filters import SERVING_ROLES
from loom_router.core.media_cost import media_cost, pick_by_cost, with_seed
from loom_router.core.media_jobs import MediaJob, MediaJobs, new_job_id
from loom_router.errors import (
    BadRequestError,
    MigrationFailedError,
    NoEndpointError,
    UpstreamBrokenError,
    UpstreamError,
    UpstreamRefusedError,
)
from loom_router.shell.metrics import RouterMetrics
from loom_router.shell.prober import Prober
from loom_router.shell.upstream import Upstream, UpstreamReply
from loom_router.shell.workflow_proxy import WorkflowProxy
from loom_runtime.wire.headers import REQUEST_ID_HEADER

logger = logging.getLogger(__name__)

IMAGES, VIDEOS = "/v1/images/generations", "/v1/videos"
RETRY_STATUSES = frozenset({502, 503})  # the worker is closing or full: another may take it
SMALL_CALL_S = 30.0  # a job's status, a cancel
CONTENT_CALL_S = 300.0  # a finished job's MP4 (encoded on first download)
_PASSED_HEADERS = ("content-type", "content-disposition")


@dataclass(frozen=True)
class MediaSettings:
    default_steps: int
    """Denoise steps of a request that names none (the card's loop steps)."""
    max_attempts: int = 4
    """Workers one request is sent to before it fails (the card's migration limit + 1)."""
    max_restarts: int = 3
    """Times a video job is started again after its worker was lost."""
    images_only: bool = False
    """A fleet that serves text too (a card with a program): only /v1/images/generations."""


def _reply(reply: UpstreamReply, body: bytes | None = None) -> web.Response:
    headers = {k: v for k, v in reply.headers.items() if k in _PASSED_HEADERS}
    return web.Response(status=reply.status, body=reply.body if body is None else body,
                        headers=headers)  # fmt: skip


class MediaProxy:
    """The media routes over the endpoint source; one per router process."""

    def __init__(
        self,
        source: StaticEndpoints,
        upstream: Upstream,
        prober: Prober,
        metrics: RouterMetrics,
        settings: MediaSettings,
        jobs: MediaJobs | None = None,
        workflows: WorkflowProxy | None = None,
    ) -> None:
        self._source, self._upstream, self._prober = source, upstream, prober
        self._metrics, self.settings = metrics, settings
        self.jobs = jobs or MediaJobs()
        self.workflows = workflows
        """Requests naming a workflow as their model, and its jobs."""
        self._images: dict[str, float] = {}  # endpoint -> predicted work of images in flight
        self._rng = random.Random()
        self._rid: Callable[[web.Request], str] = lambda _: ""

    def add_routes(self, app: web.Application, request_id: Callable[[web.Request], str]) -> None:
        """Register the routes; `request_id` reads the id the router's middleware gave."""
        self._rid = request_id
        app.router.add_post(IMAGES, self.images)
        if self.settings.images_only:
            return
        app.router.add_post(VIDEOS, self.create_video)
        app.router.add_get(VIDEOS + "/{video_id}", self.get_video)
        app.router.add_get(VIDEOS + "/{video_id}/content", self.video_content)
        app.router.add_delete(VIDEOS + "/{video_id}", self.delete_video)

    # --- routes -------------------------------------------------------------------------------

    async def images(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if self.workflows is not None and (flow := self.workflows.named(body)) is not None:
            return await self.workflows.image(flow, body, request, self._rid(request))
        body = with_seed(body, self._rng.getrandbits(63))
        cost = media_cost(body, False, self.settings.default_steps).units
        rid = self._rid(request)
        _, reply = await self._post(IMAGES, body, cost, rid, frozenset(), images=True)
        return _reply(reply)

    async def create_video(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if self.workflows is not None and (flow := self.workflows.named(body)) is not None:
            return await self.workflows.create_video(flow, body, request, self._rid(request))
        body = with_seed(body, self._rng.getrandbits(63))
        cost = media_cost(body, True, self.settings.default_steps).units
        endpoint, reply = await self._post(VIDEOS, body, cost, self._rid(request), frozenset())
        doc = reply.json()
        if reply.status != 202 or not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
            return _reply(reply)
        job = MediaJob(new_job_id(), endpoint.id, doc["id"], body, cost, time.monotonic())
        self.jobs.add(job, job.created_at)
        return web.json_response(self._public(doc, job), status=202)

    async def get_video(self, request: web.Request) -> web.Response:
        video_id = request.match_info["video_id"]
        if self.workflows is not None and WorkflowProxy.owns(video_id):
            return await self.workflows.get_video(video_id, request, self._rid(request))
        job = self.jobs.get(video_id, time.monotonic())
        doc = await self._status(job, self._rid(request))
        return web.json_response(doc)

    async def video_content(self, request: web.Request) -> web.Response:
        video_id = request.match_info["video_id"]
        if self.workflows is not None and WorkflowProxy.owns(video_id):
            return await self.workflows.video_content(video_id, request, self._rid(request))
        job = self.jobs.get(video_id, time.monotonic())
        path = f"{VIDEOS}/{job.worker_job_id}/content"
        reply = await self._call(job, "GET", path, CONTENT_CALL_S)
        if reply is None or reply.status == 404:
            doc = await self._restart(job, self._rid(request))
            return web.json_response(_not_ready(doc), status=409)
        response = _reply(reply)
        if "content-disposition" in reply.headers:
            response.headers["Content-Disposition"] = f'attachment; filename="{job.id}.mp4"'
        return response

    async def delete_video(self, request: web.Request) -> web.Response:
        video_id = request.match_info["video_id"]
        if self.workflows is not None and WorkflowProxy.owns(video_id):
            return await self.workflows.delete_video(video_id, request, self._rid(request))
        job = self.jobs.get(video_id, time.monotonic())
        reply = await self._call(job, "DELETE", f"{VIDEOS}/{job.worker_job_id}", SMALL_CALL_S)
        if reply is None or reply.status == 404:  # its worker is gone: nothing runs any more
            self.jobs.remove(job.id)
            return web.json_response({"id": job.id, "object": "video.deleted", "deleted": True})
        doc = reply.json()
        if not isinstance(doc, dict):
            return _reply(reply)
        if doc.get("deleted"):
            self.jobs.remove(job.id)
        return web.json_response(self._public(doc, job), status=reply.status)

    # --- jobs ---------------------------------------------------------------------------------

    async def _status(self, job: MediaJob, rid: str) -> dict[str, Any]:
        """The job's status from its worker, or (worker lost, job gone from it, or failed by a
        worker that stopped) the status of the job started again elsewhere."""
        reply = await self._call(job, "GET", f"{VIDEOS}/{job.worker_job_id}", SMALL_CALL_S)
        doc = None if reply is None or reply.status != 200 else reply.json()
        if not isinstance(doc, dict) or _worker_failed(doc):
            return await self._restart(job, rid)
        job = self.jobs.saw_status(job.id, str(doc.get("status")), time.monotonic())
        return self._public(doc, job)

    async def _restart(self, job: MediaJob, rid: str) -> dict[str, Any]:
        """Start `job` again from its seed on another worker (same body: same video)."""
        if job.restarts >= self.settings.max_restarts:
            self._metrics.inc("migrations", "exhausted")
            self.jobs.saw_status(job.id, "failed", time.monotonic())
            return self._failed(job, f"its worker was lost {job.restarts + 1} times; giving up")
        try:
            endpoint, reply = await self._post(
                VIDEOS, job.body, job.cost, rid, frozenset({job.endpoint_id})
            )
        except (NoEndpointError, MigrationFailedError) as exc:
            self._metrics.inc("migrations", "no_endpoint")
            return self._failed(job, f"its worker was lost and no other could start it: {exc}")
        doc = reply.json()
        if reply.status != 202 or not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
            self.jobs.saw_status(job.id, "failed", time.monotonic())
            return self._failed(job, f"restart refused by {endpoint.id} ({reply.status})")
        self._metrics.inc("migrations", "restarted")
        moved = self.jobs.moved(job.id, endpoint.id, doc["id"])
        logger.warning(
            "video job restarted from its seed on another worker",
            extra={"job": job.id, "from": job.endpoint_id, "to": endpoint.id},
        )
        return self._public(doc, moved)

    def _public(self, doc: Mapping[str, Any], job: MediaJob) -> dict[str, Any]:
        return {**doc, "id": job.id, "restarts": job.restarts}

    def _failed(self, job: MediaJob, why: str) -> dict[str, Any]:
        return {"id": job.id, "object": "video", "status": "failed", "restarts": job.restarts,
                "error": {"message": f"video job {job.id}: {why}"}}  # fmt: skip

    async def _call(
        self, job: MediaJob, method: str, path: str, timeout_s: float
    ) -> UpstreamReply | None:
        """`method path` on the job's worker; None when that worker is lost (gone from the
        fleet, marked down, or not answering)."""
        endpoint = self._source.snapshot().get(job.endpoint_id)
        if endpoint is None or endpoint.down:
            return None
        try:
            return await self._upstream.call(endpoint, method, path, timeout_s)
        except UpstreamError as exc:
            self._lost(endpoint, exc)
            return None

    # --- the attempt loop ---------------------------------------------------------------------

    async def _post(
        self,
        path: str,
        body: Mapping[str, Any],
        cost: float,
        rid: str,
        exclude: frozenset[str],
        images: bool = False,
    ) -> tuple[Endpoint, UpstreamReply]:
        """POST to the least-loaded worker; on a lost worker or a 502/503 the next one, up to
        `max_attempts` workers. The seed is pinned, so any worker makes the same pixels."""
        tried = set(exclude)
        last: UpstreamReply | None = None
        for attempt in range(self.settings.max_attempts):
            endpoint = self._pick(cost, tried, images)
            if endpoint is None:
                break
            tried.add(endpoint.id)
            if attempt:
                self._metrics.inc("migrations", "restarted")
            self._metrics.inc("routed", endpoint.id, "migration" if attempt else "cost")
            if images:
                self._images[endpoint.id] = self._images.get(endpoint.id, 0.0) + cost
            try:
                reply = await self._upstream.post(endpoint, path, body, {REQUEST_ID_HEADER: rid})
            except UpstreamError as exc:
                self._lost(endpoint, exc)
                continue
            finally:
                if images:
                    self._settle(endpoint.id, cost)
            if reply.status not in RETRY_STATUSES:
                return endpoint, reply
            last = reply
        if last is not None:
            raise MigrationFailedError(
                f"every worker tried refused the request (last: {last.status} "
                f"{last.body[:200].decode(errors='replace')})"
            )
        if len(tried) > len(exclude):
            raise MigrationFailedError(f"the request's workers were lost ({', '.join(tried)})")
        raise NoEndpointError("no diffusion worker is ready (none registered, draining or down)")

    def _pick(self, cost: float, tried: set[str], images: bool) -> Endpoint | None:
        snapshot = self._source.snapshot()
        candidates = [e.id for e in snapshot.endpoints
                      if e.routable and e.role in SERVING_ROLES and e.id not in tried]  # fmt: skip
        outstanding = dict(self.jobs.outstanding())
        for endpoint_id, work in self._images.items():
            outstanding[endpoint_id] = outstanding.get(endpoint_id, 0.0) + work
        chosen = pick_by_cost(candidates, outstanding, cost)
        return None if chosen is None else snapshot.by_id[chosen]

    def _settle(self, endpoint_id: str, cost: float) -> None:
        left = self._images.get(endpoint_id, 0.0) - cost
        if left > 1e-9:
            self._images[endpoint_id] = left
        else:
            self._images.pop(endpoint_id, None)

    def _lost(self, endpoint: Endpoint, exc: UpstreamError) -> None:
        kind = "broken" if isinstance(exc, UpstreamBrokenError) else "refused"
        self._metrics.inc("upstream_errors", endpoint.id, kind)
        if isinstance(exc, UpstreamRefusedError):
            self._prober.refused(endpoint.id, str(exc))
        else:
            self._prober.suspect(endpoint.id)
        logger.warning("diffusion worker lost", extra={"endpoint": endpoint.id, "cause": str(exc)})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except ValueError:
            raise BadRequestError("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequestError("the request body must be a JSON object")
        return body


def _worker_failed(doc: Mapping[str, Any]) -> bool:
    """A job its worker failed (aborted by a pause or a shutdown; a client's cancel ends as
    "cancelled" instead)."""
    return doc.get("status") == "failed"


def _not_ready(doc: Mapping[str, Any]) -> dict[str, Any]:
    message = (
        f"video job {doc.get('id')} is {doc.get('status')}: its worker was lost, so it was "
        "started again; poll it until it is completed"
    )
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": "not_ready"}}  # fmt: skip
