"""`loom up examples/tiny-tp.yaml` end to end (router + one llama worker whose forwards run on
two tensor-parallel gloo rank processes): greedy completions through the router equal the
one-rank engine's on the same checkpoint, and the worker reports both ranks' halves of the KV."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.operator.local.sparse_helpers import metrics, post, rank_labels, sample

from loom_operator.testing.fleet import FleetProcess
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import SamplingParams
from loom_runtime.models.loader import load_model

STEPS = 12


EXAMPLE = "tiny-tp"


@pytest.fixture(scope="module")
def fleet(tiny_example: FleetProcess) -> FleetProcess:
    return tiny_example


def one_rank(checkpoint: Path, prompt: list[int], steps: int) -> list[int]:
    """The one-rank engine's greedy tokens in float32 (the card's precision)."""
    engine = Engine(load_model(checkpoint, dtype=torch.float32), EngineConfig(max_model_len=1024))
    try:
        params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
        return list(engine.generate(prompt, params).output_token_ids)
    finally:
        engine.shutdown()


def test_greedy_completions_through_the_router_equal_one_rank(
    fleet: FleetProcess, checkpoints: tuple[Path, Path]
) -> None:
    for prompt in ("tensor parallel ranks " * 10, "one scheduler, two shards"):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": STEPS, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        [choice] = post(f"{fleet.endpoint}/completions", body)["choices"]
        assert choice["token_ids"] == one_rank(checkpoints[0], choice["prompt_token_ids"], STEPS)


def test_the_worker_runs_on_two_ranks_each_with_half_the_kv(fleet: FleetProcess) -> None:
    status = fleet.status()
    assert status is not None
    [worker] = status.workers
    text = metrics(worker)
    assert rank_labels(text) == {"0", "1"}
    per_rank = sample(text, "loom:rank_kv_bytes_per_token")
    assert per_rank * 2 == sample(text, "loom:kv_bytes_per_token")
