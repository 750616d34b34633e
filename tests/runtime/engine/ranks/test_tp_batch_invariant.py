"""Batch-invariant mode on two tensor-parallel ranks (tp 2, float32): each rank runs its shard's
matmuls and attention in fixed tiles and adds the partial sums of o_proj and down_proj in rank
order (parallel/collectives.py `ordered_sum`), so a request's tokens and log-probs are the same
bits batched with others as alone, and with its prompt prefilled whole, in chunks or from the
prefix cache — as on one rank (tests/runtime/engine/test_batch_invariant.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tests.runtime.engine.invariance_helpers import Records, serve_waves
from tests.runtime.engine.ranks_config import ranks_config

from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.parallel.layout import ParallelLayout


def requests() -> list[EngineRequest]:
    """Four sampled requests, prompts of 5 to 49 tokens (49: from the prefix cache only its
    last token is computed, as a decode step)."""
    return [
        EngineRequest(
            f"r{i}",
            tuple((t * 37 + 11 * i) % 3000 + 5 for t in range(n)),
            SamplingParams(max_tokens=8, temperature=0.8, seed=i, logprobs=0, ignore_eos=True),
        )
        for i, n in enumerate([5, 30, 49, 12])
    ]


def waves(
    checkpoint: Path, batches: Sequence[Sequence[EngineRequest]], **config: object
) -> list[Records]:
    """Each batch run together, one batch after another, in one batch-invariant tp 2 engine."""
    return serve_waves(Engine.from_checkpoint(checkpoint, ranks_config(
        ParallelLayout(tp=2), dtype=torch.float32, batch_invariant=True, **config
    )), batches)  # fmt: skip


def test_a_request_on_tp_ranks_is_the_same_bits_batched_chunked_or_cached(tiny_dir: Path) -> None:
    reqs = requests()
    together, *alone = waves(tiny_dir, [reqs, *([r] for r in reqs)], prefix_caching=False)
    assert all(len(r) == 8 for r in together.values())
    assert together == {rid: rec for one in alone for rid, rec in one.items()}
    long = [reqs[2]]
    whole, cached = waves(tiny_dir, [long, long])  # the second: a prefix hit
    assert cached == whole == {"r2": together["r2"]}
    (chunked,) = waves(tiny_dir, [long], max_num_batched_tokens=12)
    assert chunked == whole
