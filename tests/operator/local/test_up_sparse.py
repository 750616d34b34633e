"""`loom up examples/tiny-sparse-pcp.yaml` end to end (router + one worker whose forwards run on
two gloo rank processes, PCP2 × DCP2 × EP2): a greedy completion through the router equals the
one-rank forward of the same checkpoint, and the worker exports both ranks' KV."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from loom_operator.testing.fleet import FleetProcess, run_fleet
from loom_runtime.models.sparse_mla.loader import load_sparse_mla
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "tiny-sparse-pcp.yaml"
STEPS = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_sparse_mla(tmp_path_factory.mktemp("tiny-sparse-mla") / "tiny")


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, checkpoint: Path, child_env: dict[str, str]
) -> Iterator[FleetProcess]:
    root = tmp_path_factory.mktemp("up-sparse")
    card = root / "tiny-sparse-pcp.yaml"
    card.write_text(EXAMPLE.read_text().replace("loom://tiny-sparse-mla", f"file://{checkpoint}"))
    with run_fleet(card, root / "state", child_env) as f:
        yield f


def post(url: str, body: dict[str, object]) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def one_rank(checkpoint: Path, prompt: list[int], steps: int) -> list[int]:
    model = load_sparse_mla(checkpoint, dtype=torch.float32).model
    cache = model.new_cache(len(prompt) + steps)
    logits = model.forward(torch.tensor(prompt), cache)
    out: list[int] = []
    for _ in range(steps):
        out.append(int(logits[-1].argmax()))
        logits = model.forward(torch.tensor(out[-1:]), cache)
    return out


def test_a_greedy_completion_through_the_router_equals_one_rank(
    fleet: FleetProcess, checkpoint: Path
) -> None:
    body = {"model": "tiny-sparse-mla", "prompt": "the ranks of one worker " * 12,
            "max_tokens": STEPS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    reply = post(f"{fleet.endpoint}/completions", body)
    [choice] = reply["choices"]
    assert choice["token_ids"] == one_rank(checkpoint, choice["prompt_token_ids"], STEPS)


def test_the_worker_runs_on_two_ranks_and_exports_their_kv(fleet: FleetProcess) -> None:
    status = fleet.status()
    assert status is not None
    [worker] = status.workers
    base = worker.address if worker.address.startswith("http") else f"http://{worker.address}"
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    ranks = {line.split('rank="')[1].split('"')[0] for line in text.splitlines()
             if line.startswith("loom:rank_kv_bytes_per_token{")}  # fmt: skip
    assert ranks == {"0", "1"}
