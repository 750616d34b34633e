"""`loom up examples/tiny-sparse-pcp.yaml` end to end (router + one worker whose forwards run on
two gloo rank processes, PCP2 × DCP2 × EP2): a greedy completion through the router equals the
one-rank forward of the same checkpoint, and the worker exports both ranks' KV."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.operator.local.sparse_helpers import example_fleet, metrics, one_rank, post, rank_labels

from loom_operator.testing.fleet import FleetProcess

STEPS = 12


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, sparse_checkpoint: Path, child_env: dict[str, str]
) -> Iterator[FleetProcess]:
    with example_fleet(
        "tiny-sparse-pcp", tmp_path_factory.mktemp("up-sparse"), sparse_checkpoint, child_env
    ) as f:
        yield f


def test_a_greedy_completion_through_the_router_equals_one_rank(
    fleet: FleetProcess, sparse_checkpoint: Path
) -> None:
    body = {"model": "tiny-sparse-mla", "prompt": "the ranks of one worker " * 12,
            "max_tokens": STEPS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    reply = post(f"{fleet.endpoint}/completions", body)
    [choice] = reply["choices"]
    assert choice["token_ids"] == one_rank(sparse_checkpoint, choice["prompt_token_ids"], STEPS)


def test_the_worker_runs_on_two_ranks_and_exports_their_kv(fleet: FleetProcess) -> None:
    status = fleet.status()
    assert status is not None
    [worker] = status.workers
    assert rank_labels(metrics(worker)) == {"0", "1"}
