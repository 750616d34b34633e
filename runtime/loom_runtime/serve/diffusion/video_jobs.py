"""The video job store: one record per `POST /v1/videos` job, bounded, finished jobs kept for a TTL.

Owns job status transitions and eviction; never runs the engine or encodes video (it holds what
the API hands it). Not thread-safe: the event loop is its only caller.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from loom_runtime.errors import AdmissionError
from loom_runtime.serve.errors import JobNotFoundError

JobStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


@dataclass
class VideoJob:
    """One job: what was asked, where it is, and (once completed) its frames or MP4 bytes."""

    id: str
    model: str
    created_at: int
    width: int
    height: int
    num_frames: int
    fps: int
    seed: int
    status: JobStatus = "queued"
    steps_done: int = 0
    steps_total: int = 0
    finished_at: float | None = None  # monotonic clock: when it reached a FINISHED status
    error: str | None = None
    cancel_requested: bool = False  # DELETE came while it ran: its abort means "cancelled"
    frames: np.ndarray | None = field(default=None, repr=False)  # [F, H, W, 3] uint8
    mp4: bytes | None = field(default=None, repr=False)

    def body(self) -> dict[str, Any]:
        """The OpenAI video object, with Loom's step counts."""
        pct = (
            100
            if self.status == "completed"
            else int(100 * self.steps_done / max(1, self.steps_total))
        )
        return {
            "id": self.id, "object": "video", "model": self.model, "status": self.status,
            "progress": pct, "steps_done": self.steps_done, "steps_total": self.steps_total,
            "created_at": self.created_at, "size": f"{self.width}x{self.height}",
            "num_frames": self.num_frames, "fps": self.fps,
            "seconds": f"{(self.num_frames - 1) / self.fps:g}", "seed": self.seed,
            "error": None if self.error is None else {"message": self.error},
        }  # fmt: skip


class JobStore:
    """At most `max_jobs` jobs; finished ones are dropped `ttl_s` after they finished, or
    earliest-finished first when a new job needs room. Unfinished jobs are never evicted: when
    all slots hold them, a new job is refused (503)."""

    def __init__(
        self, max_jobs: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_jobs < 1 or ttl_s <= 0:
            raise ValueError(f"max_jobs must be >= 1 and ttl_s > 0, got {max_jobs}, {ttl_s}")
        self.max_jobs, self.ttl_s, self._clock = max_jobs, ttl_s, clock
        self._jobs: OrderedDict[str, VideoJob] = OrderedDict()

    def __len__(self) -> int:
        self.expire()
        return len(self._jobs)

    def add(self, job: VideoJob) -> None:
        self.expire()
        if len(self._jobs) >= self.max_jobs:
            done = sorted(
                (j for j in self._jobs.values() if j.finished_at is not None),
                key=lambda j: j.finished_at or 0.0,
            )
            if not done:
                raise AdmissionError(
                    f"{len(self._jobs)} video jobs are unfinished (limit {self.max_jobs}); "
                    "retry when one completes"
                )
            del self._jobs[done[0].id]
        self._jobs[job.id] = job

    def get(self, job_id: str) -> VideoJob:
        self.expire()
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(f"no video job {job_id!r} (unknown, deleted or expired)")
        return job

    def remove(self, job_id: str) -> VideoJob:
        job = self.get(job_id)
        del self._jobs[job_id]
        return job

    def finish(self, job_id: str, status: JobStatus, error: str | None = None) -> VideoJob | None:
        """Move a job to a finished status (None if it is gone already)."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        job.status, job.error, job.finished_at = status, error, self._clock()
        return job

    def expire(self) -> int:
        now = self._clock()
        old = [
            j.id for j in self._jobs.values()
            if j.finished_at is not None and now - j.finished_at > self.ttl_s
        ]  # fmt: skip
        for job_id in old:
            del self._jobs[job_id]
        return len(old)
