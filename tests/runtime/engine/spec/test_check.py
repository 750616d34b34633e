"""An engine asked for MTP speculation (`mtp_draft_tokens`) refuses, with a typed error naming
the model and the fix, a model without MTP layers or outside sparse-mla; an aggregated
sparse-mla engine runs it (its cache then holds the MTP layer's rows, as the planner counts
them; a worker's ranks run it too: test_ranked_mtp.py); with MTP off nothing changes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tests.runtime.engine.sparse_mla_helpers import planner_shape

from loom_operator.fleet.kv_layout import kv_bytes_per_token
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.spec.check import check_mtp
from loom_runtime.errors import SpeculativeConfigError
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.config import SparseMlaConfig

MTP3 = EngineConfig(dtype=torch.float64, num_blocks=64, max_model_len=512, mtp_draft_tokens=3)


def test_a_negative_draft_count_is_refused() -> None:
    with pytest.raises(ValueError, match="mtp_draft_tokens must be >= 0"):
        EngineConfig(mtp_draft_tokens=-1)


def test_a_model_outside_sparse_mla_is_refused(tiny64: LoadedModel) -> None:
    with pytest.raises(SpeculativeConfigError, match=r"needs a sparse-mla model.*'llama'"):
        Engine(tiny64, MTP3)


def test_a_checkpoint_without_mtp_layers_is_refused(sparse64: LoadedModel) -> None:
    config = sparse64.config
    assert isinstance(config, SparseMlaConfig)
    bare = replace(config, num_nextn_predict_layers=0)
    with pytest.raises(SpeculativeConfigError, match="has no MTP layer"):
        check_mtp(bare, MTP3)


def test_an_aggregated_engine_runs_it_with_the_mtp_layers_rows_in_its_cache(
    sparse64: LoadedModel,
) -> None:
    config = sparse64.config
    assert isinstance(config, SparseMlaConfig)
    engine = Engine(sparse64, MTP3)
    trunk = config.kv_spec(16, 1, torch.float64).bytes_per_block // 16
    mtp = (config.kv_lora_rank + config.qk_rope_head_dim + config.index_head_dim) * 8
    # float64 KV is twice the planner's fp32 figure, which counts the MTP layer the same way
    planned = kv_bytes_per_token(replace(planner_shape(sparse64, "fp32"), mtp_layers=1))
    assert engine.stats().kv_bytes_per_token == trunk + mtp == 2 * planned
    assert engine.stats().spec is not None and engine.stats().spec.num_drafts == 0
    with pytest.raises(ValueError, match=r"mtp_layers must be in 0\.\.1"):
        config.kv_spec(16, 1, torch.float64, mtp_layers=2)


def test_with_mtp_off_every_model_passes(sparse64: LoadedModel, tiny64: LoadedModel) -> None:
    off = replace(MTP3, mtp_draft_tokens=0)
    for loaded in (sparse64, tiny64):
        check_mtp(loaded.config, off)
    assert Engine(sparse64, off).num_blocks == 64
