"""The video job store: bounded, finished jobs expire after their TTL or make room oldest-finished
first, unfinished jobs are never evicted (a full store of them refuses), unknown ids are 404s."""

from __future__ import annotations

import pytest

from loom_runtime.errors import AdmissionError
from loom_runtime.serve.diffusion.video_jobs import JobStore, VideoJob
from loom_runtime.serve.errors import JobNotFoundError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def job(job_id: str) -> VideoJob:
    return VideoJob(job_id, "m", 0, 32, 32, 5, 8, 0)


def test_finished_jobs_expire_after_their_ttl() -> None:
    clock = Clock()
    store = JobStore(4, ttl_s=10, clock=clock)
    store.add(job("a"))
    store.add(job("b"))
    store.add(job("running"))
    store.finish("a", "completed")
    clock.now = 5
    store.finish("b", "cancelled")
    clock.now = 10
    assert store.get("a").status == "completed"  # exactly its TTL: still there
    clock.now = 10.5
    with pytest.raises(JobNotFoundError):
        store.get("a")
    assert store.get("b").status == "cancelled"  # finished at 5: within its TTL
    clock.now = 1000
    assert store.get("running").status == "queued"  # unfinished jobs never expire


def test_a_full_store_evicts_the_earliest_finished_job_first() -> None:
    clock = Clock()
    store = JobStore(2, ttl_s=100, clock=clock)
    store.add(job("a"))
    store.add(job("b"))
    clock.now = 1
    store.finish("b", "completed")
    clock.now = 2
    store.finish("a", "completed")
    store.add(job("c"))
    with pytest.raises(JobNotFoundError):
        store.get("b")
    assert {store.get("a").id, store.get("c").id} == {"a", "c"}


def test_a_store_full_of_unfinished_jobs_refuses_new_ones() -> None:
    store = JobStore(1, ttl_s=100)
    store.add(job("a"))
    with pytest.raises(AdmissionError, match="unfinished"):
        store.add(job("b"))
    assert len(store) == 1


def test_unknown_and_removed_jobs_are_not_found() -> None:
    store = JobStore(2, ttl_s=100)
    store.add(job("a"))
    store.remove("a")
    with pytest.raises(JobNotFoundError, match="'a'"):
        store.get("a")
    assert store.finish("a", "completed") is None


def test_the_job_body_reports_progress_in_steps_and_percent() -> None:
    j = job("a")
    j.status, j.steps_done, j.steps_total = "in_progress", 1, 4
    body = j.body()
    assert (body["progress"], body["steps_done"], body["steps_total"]) == (25, 1, 4)
    assert body["size"] == "32x32" and body["object"] == "video"
