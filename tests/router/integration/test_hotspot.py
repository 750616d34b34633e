"""The hot-spot case against real workers: 100 requests sharing one system prompt over 4 workers.

Only worker `a` holds the prompt when the burst starts. Prefix affinity alone would send every
request to `a`; the hot-spot rule must spill them to the others (which then cache the prompt
too), so the load spreads while the prompt keeps being reused.
"""

from __future__ import annotations

import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

from loom_runtime.testing.processes import post

MODEL = "tiny-router"
NAMES = ("a", "b", "c", "d")
REQUESTS = 100


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 4000) for _ in range(n)]


def test_a_shared_system_prompt_spreads_over_the_fleet(
    launch_worker: Any, launch_router: Any
) -> None:
    system = tokens(0, 320)
    with ExitStack() as stack:
        workers = [stack.enter_context(launch_worker(name)) for name in NAMES]
        router = stack.enter_context(
            launch_router(workers, router={"sessionAffinity": {"enabled": False}})
        )
        router.wait_fresh(list(NAMES))
        first = {"model": MODEL, "prompt": system, "max_tokens": 1, "temperature": 0}
        status, answer, _ = post(workers[0].url + "/v1/completions", first)
        assert status == 200, answer  # only `a` holds the system prompt, and the router knows
        router.wait(
            lambda: (
                router.metric("loom_router:index_entries", index="precise") >= len(system) // 16
            ),
            "the index to learn the system prompt on a",
        )

        def ask(i: int) -> tuple[str, int]:
            body = {
                "model": MODEL, "prompt": system + tokens(1000 + i, 16), "max_tokens": 8,
                "temperature": 0, "ignore_eos": True,
            }  # fmt: skip
            status, answer, headers = router.post("/v1/completions", body)
            assert status == 200, answer
            return headers["x-loom-endpoint"], answer["usage"]["prompt_tokens_details"][
                "cached_tokens"
            ]

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(REQUESTS)))
        spilled = sum(
            router.metric("loom_router:routed_total", endpoint=name, reason="spill")
            for name in NAMES
        )

    served = Counter(endpoint for endpoint, _ in answers)
    # Most workers took a share and none took most of them. (On a saturated machine one
    # worker's /metrics scrape can go stale for the whole burst; unknown load scores 0 and that
    # worker may then get none, which is the scorers' rule, not a hot spot.)
    assert len(served) >= len(NAMES) - 1, served
    assert max(served.values()) <= REQUESTS // 2, served
    reused = sum(1 for _, cached in answers if cached >= 256)
    assert reused >= REQUESTS // 2, f"only {reused} requests reused the cached system prompt"
    assert spilled > 0  # the hot-spot rule moved work off the prompt's busiest holders
