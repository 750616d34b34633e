"""`loom up examples/tiny-sparse-pd.yaml` end to end (router, one prefill replica on two gloo
rank processes, PCP2 × DCP2 × EP2, and two one-rank decode replicas): greedy completions
through the router, prefilled on the ranks and decoded after a KV pull, equal the one-rank
forward of the same checkpoint; the prefill exports both ranks' KV and the decodes pull."""

from __future__ import annotations

from collections.abc import Iterator
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

STEPS = 8


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, sparse_checkpoint: Path, child_env: dict[str, str]
) -> Iterator[FleetProcess]:
    with example_fleet(
        "tiny-sparse-pd", tmp_path_factory.mktemp("up-sparse-pd"), sparse_checkpoint, child_env
    ) as f:
        yield f


def test_pd_completions_from_the_ranks_equal_one_rank(
    fleet: FleetProcess, sparse_checkpoint: Path
) -> None:
    for i, text in enumerate(["prefilled on two ranks " * 12, "then pulled by a decode " * 20]):
        body = {"model": "tiny-sparse-mla", "prompt": text, "max_tokens": STEPS,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        [choice] = post(f"{fleet.endpoint}/completions", body)["choices"]
        want = one_rank(sparse_checkpoint, choice["prompt_token_ids"], STEPS)
        assert choice["token_ids"] == want, f"completion {i}"


def test_the_prefill_runs_on_two_ranks_and_the_decodes_pull_its_kv(fleet: FleetProcess) -> None:
    status = fleet.status()
    assert status is not None
    roles = sorted(w.role for w in status.workers)
    assert roles == ["decode", "decode", "prefill"]
    [prefill] = [w for w in status.workers if w.role == "prefill"]
    assert rank_labels(metrics(prefill)) == {"0", "1"}
    decodes = [metrics(w) for w in status.workers if w.role == "decode"]
    assert sum(sample(m, "loom:kv_pulled_bytes_total") for m in decodes) > 0
