"""`loom up examples/tiny-sparse-dp.yaml` end to end (router + one worker whose two rank
processes are DP attention replicas sharing their experts, DP2 × EP2, with MTP speculation on
the ranks): concurrent greedy completions through the router each equal the one-rank forward,
the ranks' drafts were verified, and the worker reports both ranks' KV."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.operator.local.sparse_helpers import (
    example_fleet,
    metrics,
    one_rank,
    post,
    rank_labels,
    sample,
)

from loom_operator.testing.fleet import FleetProcess

STEPS = 24


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, sparse_checkpoint: Path, child_env: dict[str, str]
) -> Iterator[FleetProcess]:
    with example_fleet(
        "tiny-sparse-dp", tmp_path_factory.mktemp("up-sparse-dp"), sparse_checkpoint, child_env
    ) as f:
        yield f


def test_concurrent_completions_through_the_router_equal_one_rank(
    fleet: FleetProcess, sparse_checkpoint: Path
) -> None:
    def complete(prompt: str) -> dict[str, object]:
        body = {"model": "tiny-sparse-mla", "prompt": prompt, "max_tokens": STEPS,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        [choice] = post(f"{fleet.endpoint}/completions", body)["choices"]
        return dict(choice)

    prompts = [f"replica {i} of the worker " * (3 + i) for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        choices = list(pool.map(complete, prompts))
    for choice in choices:
        prompt_ids = list(choice["prompt_token_ids"])  # type: ignore[call-overload]
        assert choice["token_ids"] == one_rank(sparse_checkpoint, prompt_ids, STEPS)
    status = fleet.status()
    assert status is not None
    [worker] = status.workers
    text = metrics(worker)
    assert rank_labels(text) == {"0", "1"}
    assert sample(text, "vllm:spec_decode_num_drafts_total") > 0  # MTP drafted on the ranks
