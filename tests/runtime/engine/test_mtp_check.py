"""An engine asked for MTP speculation (`mtp_draft_tokens`) refuses, with a typed error naming
the model and the fix, a model without MTP layers or outside sparse-mla, a P/D role, HiSparse,
and — until the batched step runs verify rows — every engine; with MTP off nothing changes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.mtp_check import check_mtp
from loom_runtime.errors import SpeculativeConfigError
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.config import SparseMlaConfig

MTP3 = EngineConfig(dtype=torch.float64, num_blocks=64, max_model_len=512, mtp_draft_tokens=3)


def test_a_negative_draft_count_is_refused() -> None:
    with pytest.raises(ValueError, match="mtp_draft_tokens must be >= 0"):
        EngineConfig(mtp_draft_tokens=-1)


def test_mtp_beside_hisparse_is_refused() -> None:
    with pytest.raises(ValueError, match=r"MTP speculation .* and HiSparse"):
        EngineConfig(mtp_draft_tokens=2, hisparse_host_pool_gib=1.0)


def test_a_model_outside_sparse_mla_is_refused(tiny64: LoadedModel) -> None:
    with pytest.raises(SpeculativeConfigError, match=r"needs a sparse-mla model.*'llama'"):
        Engine(tiny64, MTP3)


def test_a_checkpoint_without_mtp_layers_is_refused(sparse64: LoadedModel) -> None:
    config = sparse64.config
    assert isinstance(config, SparseMlaConfig)
    bare = replace(config, num_nextn_predict_layers=0)
    with pytest.raises(SpeculativeConfigError, match="has no MTP layer"):
        check_mtp(bare, MTP3, "aggregated")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pd_role_is_refused(sparse64: LoadedModel, role: str) -> None:
    with pytest.raises(SpeculativeConfigError, match=f"aggregated role only; the {role} role"):
        check_mtp(sparse64.config, MTP3, role)


def test_the_batched_step_refuses_until_it_runs_verify_rows(sparse64: LoadedModel) -> None:
    with pytest.raises(SpeculativeConfigError, match="batched step runs no verify rows yet"):
        Engine(sparse64, MTP3)


def test_with_mtp_off_every_model_and_role_passes(
    sparse64: LoadedModel, tiny64: LoadedModel
) -> None:
    off = replace(MTP3, mtp_draft_tokens=0)
    for loaded in (sparse64, tiny64):
        for role in ("aggregated", "prefill", "decode"):
            check_mtp(loaded.config, off, role)
    assert Engine(sparse64, off).num_blocks == 64
