"""The router's video job table: lookup by the router's id, restarts onto another worker, the
outstanding work per endpoint, and its bounds (TTL of finished jobs, a maximum size)."""

from __future__ import annotations

import pytest

from loom_router.core.media_jobs import MediaJob, MediaJobs, new_job_id
from loom_router.errors import JobNotFoundError


def job(job_id: str, endpoint: str = "w0", cost: float = 10.0, at: float = 0.0) -> MediaJob:
    return MediaJob(job_id, endpoint, f"worker-{job_id}", {"seed": 1}, cost, at)


def test_ids_are_unique_video_ids() -> None:
    ids = {new_job_id() for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("video_") for i in ids)


def test_a_restart_moves_the_job_and_counts_it() -> None:
    jobs = MediaJobs()
    jobs.add(job("a"), 0.0)
    moved = jobs.moved("a", "w1", "worker-a2")
    assert (moved.endpoint_id, moved.worker_job_id, moved.restarts) == ("w1", "worker-a2", 1)
    assert jobs.get("a", 1.0) == moved and moved.body == {"seed": 1}


def test_outstanding_work_sums_unfinished_jobs_per_endpoint() -> None:
    jobs = MediaJobs()
    for name, endpoint, cost in (("a", "w0", 10.0), ("b", "w0", 5.0), ("c", "w1", 7.0)):
        jobs.add(job(name, endpoint, cost), 0.0)
    assert dict(jobs.outstanding()) == {"w0": 15.0, "w1": 7.0}
    jobs.saw_status("a", "in_progress", 1.0)
    jobs.saw_status("b", "completed", 1.0)
    assert dict(jobs.outstanding()) == {"w0": 10.0, "w1": 7.0}


def test_finished_jobs_expire_after_their_ttl_and_unknown_ids_are_404() -> None:
    jobs = MediaJobs(ttl_s=10.0)
    jobs.add(job("a"), 0.0)
    jobs.saw_status("a", "completed", 5.0)
    jobs.saw_status("a", "completed", 9.0)  # the TTL counts from the first time it was seen
    assert jobs.get("a", 15.0).finished
    with pytest.raises(JobNotFoundError, match="'a' is not known here"):
        jobs.get("a", 15.1)


def test_a_full_table_forgets_finished_jobs_first_then_the_oldest() -> None:
    jobs = MediaJobs(max_jobs=2)
    jobs.add(job("a"), 0.0)
    jobs.add(job("b"), 0.0)
    jobs.saw_status("b", "failed", 0.0)
    jobs.add(job("c"), 0.0)  # b (finished) goes, not a
    assert [j for j in ("a", "b", "c") if _known(jobs, j)] == ["a", "c"]
    jobs.add(job("d"), 0.0)  # nothing finished: the oldest goes
    assert [j for j in ("a", "c", "d") if _known(jobs, j)] == ["c", "d"] and len(jobs) == 2


def _known(jobs: MediaJobs, job_id: str) -> bool:
    try:
        jobs.get(job_id, 0.0)
    except JobNotFoundError:
        return False
    return True
