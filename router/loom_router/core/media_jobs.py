"""The router's video jobs: which worker runs each job the router created, under which of that
worker's ids, and the body to start it again from its seed when that worker is lost.

Owns the bounded table (oldest finished jobs go first, then the oldest of all) and the restart
count; never talks to workers (the shell does) and never decides that a worker is lost.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from loom_router.errors import JobNotFoundError

MAX_JOBS = 10_000
JOB_TTL_S = 3600.0  # a finished job is forgotten this long after the router saw it finish
FINISHED = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class MediaJob:
    """One job as the router knows it."""

    id: str
    """The router's id, the only one clients see."""
    endpoint_id: str
    worker_job_id: str
    body: Mapping[str, Any] = field(repr=False)
    """The create body with its seed pinned: a restart sends it again and gets the same video."""
    cost: float
    created_at: float
    restarts: int = 0
    finished_at: float | None = None
    """When the router first saw it in a finished status (None: not yet)."""

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


def new_job_id() -> str:
    return f"video_{uuid.uuid4().hex}"


class MediaJobs:
    """The table. Not thread-safe: the router's event loop is its only caller."""

    def __init__(self, max_jobs: int = MAX_JOBS, ttl_s: float = JOB_TTL_S) -> None:
        if max_jobs < 1 or ttl_s <= 0:
            raise ValueError("max_jobs must be >= 1 and ttl_s > 0")
        self.max_jobs, self.ttl_s = max_jobs, ttl_s
        self._jobs: OrderedDict[str, MediaJob] = OrderedDict()

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: MediaJob, now: float) -> None:
        """Record a new job, making room by forgetting expired, then finished, then the oldest."""
        self.expire(now)
        while len(self._jobs) >= self.max_jobs:
            victim = next((j.id for j in self._jobs.values() if j.finished), None)
            self._jobs.pop(victim if victim is not None else next(iter(self._jobs)))
        self._jobs[job.id] = job

    def get(self, job_id: str, now: float) -> MediaJob:
        self.expire(now)
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(
                f"video job {job_id!r} is not known here: it was never created through this "
                "router, was deleted, or finished more than an hour ago"
            )
        return job

    def moved(self, job_id: str, endpoint_id: str, worker_job_id: str) -> MediaJob:
        """The job was started again on `endpoint_id` (its worker was lost)."""
        job = self._jobs[job_id]
        moved = dataclasses.replace(
            job, endpoint_id=endpoint_id, worker_job_id=worker_job_id, restarts=job.restarts + 1
        )
        self._jobs[job_id] = moved
        return moved

    def saw_status(self, job_id: str, status: str, now: float) -> MediaJob:
        """Note the status a worker reported; a finished one starts the job's TTL."""
        job = self._jobs[job_id]
        if status in FINISHED and job.finished_at is None:
            job = dataclasses.replace(job, finished_at=now)
            self._jobs[job_id] = job
        return job

    def remove(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def outstanding(self) -> Mapping[str, float]:
        """Predicted work of the unfinished jobs, summed per endpoint."""
        load: dict[str, float] = {}
        for job in self._jobs.values():
            if not job.finished:
                load[job.endpoint_id] = load.get(job.endpoint_id, 0.0) + job.cost
        return MappingProxyType(load)

    def expire(self, now: float) -> None:
        gone = [j.id for j in self._jobs.values()
                if j.finished_at is not None and now - j.finished_at > self.ttl_s]  # fmt: skip
        for job_id in gone:
            del self._jobs[job_id]
