"""Routing against real workers: requests follow the KV events to the worker that holds their
prefix, a router that connects late replays the events it missed, and drained or
wrong-version endpoints receive nothing."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

MODEL = "tiny-router"
NO_SESSIONS = {"sessionAffinity": {"enabled": False}}


def prompt(seed: int, n: int = 320) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 4000) for _ in range(n)]


def body(ids: list[int], max_tokens: int = 2) -> dict[str, Any]:
    return {"model": MODEL, "prompt": ids, "max_tokens": max_tokens, "temperature": 0}


@pytest.fixture(scope="module")
def workers(launch_worker: Any) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        yield {name: stack.enter_context(launch_worker(name)) for name in ("a", "b")}


def direct(worker: Any, ids: list[int]) -> None:
    from loom_runtime.testing.processes import post

    status, answer, _ = post(worker.url + "/v1/completions", body(ids, 1))
    assert status == 200, answer


def test_requests_follow_the_kv_events_to_the_worker_holding_their_prefix(
    workers: dict[str, Any], launch_router: Any
) -> None:
    a, b = workers["a"], workers["b"]
    with launch_router([a, b], router=NO_SESSIONS) as router:
        router.wait_fresh(["a", "b"])
        on_a, on_b = prompt(1), prompt(2)
        for worker, ids in ((a, on_a), (b, on_b)):
            direct(worker, ids)  # the worker caches it and publishes BlockStored events
        blocks = len(on_a) // 16
        router.wait(
            lambda: router.metric("loom_router:index_entries", index="precise") >= 2 * blocks,
            "the index to learn both prefixes",
        )
        for turn in range(3):
            for owner, ids in (("a", on_a), ("b", on_b)):
                status, _, headers = router.post(
                    "/v1/completions", body(ids + prompt(9 + turn, 40))
                )
                assert status == 200 and headers["x-loom-endpoint"] == owner
        assert router.metric("loom_router:routed_total", endpoint="a", reason="prefix") == 3
        assert router.metric("loom_router:routed_total", endpoint="b", reason="prefix") == 3


def test_a_router_that_connects_late_replays_what_it_missed(
    workers: dict[str, Any], launch_router: Any
) -> None:
    a, b = workers["a"], workers["b"]
    missed = prompt(3)
    direct(b, missed)  # published before this router exists
    with launch_router([a, b], router=NO_SESSIONS) as router:
        router.wait_fresh(["a", "b"])
        seed = [100]

        def live_batch_from_b() -> bool:
            seed[0] += 1
            direct(b, prompt(seed[0], 16))  # any new block: a live batch with a later seq
            return bool(router.metric("loom_router:kv_batches_total", endpoint="b", source="live"))

        router.wait(live_batch_from_b, "a live KV batch from b")
        router.wait(
            lambda: router.metric("loom_router:kv_replays_total", endpoint="b", outcome="ok") > 0,
            "the replay of b's missed batches",
        )
        assert router.metric("loom_router:kv_batches_total", endpoint="b", source="replay") > 0
        status, _, headers = router.post("/v1/completions", body(missed + prompt(4, 40)))
        assert status == 200 and headers["x-loom-endpoint"] == "b"


def test_drained_and_wrong_version_endpoints_receive_nothing(
    workers: dict[str, Any], launch_router: Any, launch_worker: Any
) -> None:
    a, b = workers["a"], workers["b"]
    # `stale` runs weights v2 while discovery still says v1 (caught mid-sync): its own
    # /metrics tells the router, which must not trust the registration.
    with (
        launch_worker("stale", version="v2", registered_version="v1") as stale,
        launch_router([a, b, stale], router=NO_SESSIONS) as router,
    ):
        status, doc = router.admin("POST", "/admin/endpoints/b/drain")
        assert status == 200 and doc["draining"]
        router.wait_fresh(["a", "b", "stale"])
        favoured = prompt(5)
        for worker in (b, stale):
            direct(worker, favoured)  # make both attractive by prefix
        router.wait(
            lambda: router.metric("loom_router:index_entries", index="precise") >= 40,
            "the index to learn the prefix",
        )
        before = {w.id: w.counter("vllm:prompt_tokens_total") for w in (a, b, stale)}
        for i in range(8):
            ids = favoured + prompt(20 + i, 32) if i % 2 else prompt(20 + i)
            status, answer, headers = router.post("/v1/completions", body(ids))
            assert status == 200, answer
            assert headers["x-loom-endpoint"] == "a"
            assert headers["x-loom-weights-version"] == "v1"
        after = {w.id: w.counter("vllm:prompt_tokens_total") for w in (a, b, stale)}
        assert after["b"] == before["b"] and after["stale"] == before["stale"]
        assert after["a"] > before["a"]
        status, doc = router.admin("POST", "/admin/endpoints/b/undrain")
        assert status == 200 and not doc["draining"]
