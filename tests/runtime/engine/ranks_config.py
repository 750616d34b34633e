"""The engine config the tests of a parallel engine start from (sparse-mla's PCP/DCP/EP ranks,
llama's TP ranks): float64, 80 blocks of 16, 96-token steps, a 60 s collective timeout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from loom_runtime.engine.config import EngineConfig
from loom_runtime.models.loader import read_weights
from loom_runtime.parallel.layout import ParallelLayout

BLOCK = 16

# The sparse-mla layouts every ranked parity test covers, with the DCP merge each one uses:
# `@pytest.mark.parametrize(("layout", "backend"), SPARSE_LAYOUTS)`.
SPARSE_LAYOUTS = [
    pytest.param(ParallelLayout(pcp=2, dcp=2, interleave=1), "ag_rs", id="pcp2-dcp2-i1-ag_rs"),
    pytest.param(ParallelLayout(pcp=2, dcp=2, interleave=4), "a2a", id="pcp2-dcp2-i4-a2a"),
    pytest.param(ParallelLayout(pcp=2, ep=2), "ag_rs", id="pcp2-ep2"),
    pytest.param(ParallelLayout(dp=2, ep=2), "ag_rs", id="dp2-ep2"),
]


def ranks_config(layout: ParallelLayout, **kw: object) -> EngineConfig:
    base: dict[str, object] = dict(
        dtype=torch.float64,
        block_size=BLOCK,
        num_blocks=80,
        max_model_len=512,
        max_num_batched_tokens=96,
        max_num_seqs=8,
        parallel=layout,
        collective_timeout_s=60.0,
    )
    return EngineConfig(**(base | kw))  # type: ignore[arg-type]


def drop_layer(checkpoint: Path, layer: int) -> Path:
    """Rewrite `checkpoint` without layer `layer`'s tensors: a misfit for a weight sync."""
    kept = {n: t for n, t in read_weights(checkpoint).items() if f".layers.{layer}." not in n}
    save_file(kept, str(checkpoint / "model.safetensors"))
    return checkpoint
