"""Fixtures for the parallel sparse-mla tests: the tiny checkpoint (index top-k 64, far below
the prompts), the one-rank greedy run every parallel run is compared with, and a launcher that
runs the same request on real gloo ranks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from loom_runtime.models.sparse_mla.loader import LoadedSparseMla, load_sparse_mla
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.parallel.ranks import RankConfig, run_ranks
from loom_runtime.parallel.sparse_mla.generate import (
    BatchRequest,
    GenerateRequest,
    generate,
    generate_batch,
)
from loom_runtime.parallel.sparse_mla.plan import DcpBackend

RANKS_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class OneRank:
    """The plain forward's greedy run, in GenerateTrace's terms."""

    tokens: tuple[int, ...]
    prompt_logits: torch.Tensor
    step_logits: torch.Tensor


@pytest.fixture(scope="session")
def sparse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_sparse_mla(tmp_path_factory.mktemp("sparse-mla") / "tiny")


@pytest.fixture(scope="session")
def ours(sparse_dir: Path) -> LoadedSparseMla:
    return load_sparse_mla(sparse_dir, dtype=torch.float64)


@pytest.fixture(scope="session")
def one_rank(ours: LoadedSparseMla) -> Callable[..., OneRank]:
    """The one-rank run of (prompt, decode steps[, prefill chunk]), computed once each."""
    memo: dict[tuple[tuple[int, ...], int, int], OneRank] = {}

    def run(prompt: tuple[int, ...], steps: int, chunk: int = 0) -> OneRank:
        if (prompt, steps, chunk) not in memo:
            model = ours.model
            cache = model.new_cache(len(prompt) + steps)
            ids, size = torch.tensor(prompt), chunk or len(prompt)
            parts = [model.forward(ids[at : at + size], cache) for at in range(0, len(ids), size)]
            prompt_logits = torch.cat(parts)
            token = int(prompt_logits[-1].argmax())
            tokens, logits = [token], []
            for _ in range(steps):
                logits.append(model.forward(torch.tensor([token]), cache)[0])
                token = int(logits[-1].argmax())
                tokens.append(token)
            memo[(prompt, steps, chunk)] = OneRank(
                tuple(tokens), prompt_logits, torch.stack(logits)
            )
        return memo[(prompt, steps, chunk)]

    return run


@pytest.fixture
def on_ranks(sparse_dir: Path, tmp_path: Path) -> Callable[..., list[Any]]:
    """Run a greedy generation on the layout's gloo ranks; every rank's trace: generate's
    (one prompt per DP replica), or with `batch` generate_batch's (the prompts decoded
    together)."""

    def run(
        layout: ParallelLayout,
        prompts: tuple[tuple[int, ...], ...],
        steps: int,
        dcp_backend: DcpBackend = "ag_rs",
        pcp_split: bool = True,
        prefill_chunk: int = 0,
        batch: bool = False,
    ) -> list[Any]:
        request = GenerateRequest(
            checkpoint=str(sparse_dir),
            prompts=prompts,
            decode_steps=steps,
            layout=layout,
            dcp_backend=dcp_backend,
            pcp_split=pcp_split,
            prefill_chunk=prefill_chunk,
        )
        config = RankConfig(world=layout.world, collective_timeout_s=120.0)
        program, arg = (generate_batch, BatchRequest(request)) if batch else (generate, request)
        return run_ranks(config, program, arg, workdir=tmp_path, timeout_s=RANKS_TIMEOUT_S)

    return run
