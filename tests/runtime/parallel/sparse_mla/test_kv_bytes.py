"""The KV bytes each DCP rank holds, measured on real ranks after a prefill and decode, equal
the capacity planner's per-rank prediction for the same layout (DCP divides exactly, by the
interleaved local length), and the blocks they fill round up by less than one block."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loom_operator.fleet.capacity import RolePlan, dcp_local_length, plan_role
from loom_operator.fleet.kv_layout import Indexer, MLAAttention, ModelShape, kv_bytes_per_token
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.parallel.ranks import RankConfig, run_ranks
from loom_runtime.parallel.sparse_mla.generate import GenerateRequest, generate

PROMPT, STEPS, BLOCK = 301, 10, 16


def planner_shape(config: SparseMlaConfig) -> ModelShape:
    """The planner's view of the trunk in fp32 (the MTP layer is loaded, not run: no rows)."""
    return ModelShape(
        num_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        attention=MLAAttention(config.kv_lora_rank, config.qk_rope_head_dim),
        kv_dtype="fp32",
        indexer=Indexer(
            num_layers=len(config.full_indexer_layers),
            head_dim=config.index_head_dim,
            top_k=config.index_topk,
            num_heads=config.index_n_heads,
        ),
        mtp_layers=0,
    )


@pytest.mark.parametrize("interleave", [1, 4])
def test_dcp_kv_bytes_per_rank_equal_the_planner(
    ours: LoadedSparseMla, sparse_dir: Path, tmp_path: Path, interleave: int
) -> None:
    gen = torch.Generator().manual_seed(9)
    prompt = tuple(torch.randint(ours.config.vocab_size, (PROMPT,), generator=gen).tolist())
    layout = ParallelLayout(pcp=2, dcp=2, interleave=interleave)
    request = GenerateRequest(
        checkpoint=str(sparse_dir),
        prompts=(prompt,),
        decode_steps=STEPS,
        layout=layout,
        dtype="float32",
        all_logits=False,
        block_size=BLOCK,
    )
    traces = run_ranks(RankConfig(world=2), generate, request, workdir=tmp_path, timeout_s=240)
    context = PROMPT + STEPS  # every token fed to the model has its rows cached
    shape = planner_shape(ours.config)
    per_token = kv_bytes_per_token(shape)
    plan = plan_role(
        shape, RolePlan("prefill", pcp=2, dcp=2, interleave=interleave), context, 1 << 40
    )
    for rank, trace in enumerate(traces):
        assert trace.kv_bytes_per_token == per_token
        assert trace.kv_tokens == dcp_local_length(context, 2, interleave, rank)
        held = trace.kv_tokens * trace.kv_bytes_per_token
        assert 0 <= trace.kv_block_bytes - held < BLOCK * per_token
    assert max(t.kv_tokens * t.kv_bytes_per_token for t in traces) == plan.kv_bytes_per_rank
    assert sum(t.kv_tokens for t in traces) == context  # sharded, not replicated
