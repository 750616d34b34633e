"""SparseMlaConfig: derives indexer and MLP layer types as transformers does, and names every
problem of a config it cannot run."""

from __future__ import annotations

from typing import Any

import pytest

from loom_runtime.errors import CheckpointError
from loom_runtime.models.sparse_mla.config import SparseMlaConfig

BASE: dict[str, Any] = {
    "model_type": "glm_moe_dsa",
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "moe_intermediate_size": 8,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": 8,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 4,
    "qk_rope_head_dim": 4,
    "v_head_dim": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "index_topk": 4,
    "index_head_dim": 8,
    "index_n_heads": 2,
}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"index_topk_freq": 3, "index_skip_topk_offset": 1},
        {"index_topk_freq": 2, "index_skip_topk_offset": 1},
        {"index_topk_freq": 4, "index_skip_topk_offset": 3},
        {"index_topk_pattern": "FSSFFS"},
        {"index_topk_pattern": ["full", "shared", "full", "full", "shared", "shared"]},
        {"first_k_dense_replace": 2},
        {"first_k_dense_replace": 9},
    ],
)
def test_layer_types_are_derived_as_transformers_derives_them(extra: dict[str, Any]) -> None:
    from transformers import GlmMoeDsaConfig

    raw = {**BASE, **extra}
    ours = SparseMlaConfig.from_dict(raw)
    hf = GlmMoeDsaConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    assert ours.indexer_types == tuple(hf.indexer_types)
    assert ours.mlp_layer_types == tuple(hf.mlp_layer_types)
    assert ours.full_indexer_layers == tuple(
        i for i, kind in enumerate(hf.indexer_types) if kind == "full"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "deepseek_v3"}, "model_type 'deepseek_v3' is not 'glm_moe_dsa'"),
        ({"index_topk_pattern": "SFFFFF"}, "indexer_types[0] must be 'full'"),
        ({"index_topk_freq": 2, "index_skip_topk_offset": 0}, "indexer_types[0] must be 'full'"),
        ({"indexer_types": ["full"] * 5}, "indexer_types has 5 entries for 6 layers"),
        ({"indexer_types": ["full", "dense"] * 3}, "indexer_types ['dense'] are not among"),
        ({"num_key_value_heads": 1}, "must equal num_attention_heads"),
        ({"n_group": 3}, "must split into n_group (3) groups"),
        ({"n_group": 2, "topk_group": 3}, "topk_group must be between 1 and n_group (2)"),
        ({"num_experts_per_tok": 5}, "exceeds n_routed_experts"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4}}, "rope type 'yarn'"),
        ({"q_lora_rank": None}, "q_lora_rank must be a positive integer"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ],
)
def test_a_config_it_cannot_run_is_refused_naming_the_field(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(CheckpointError) as err:
        SparseMlaConfig.from_dict({**BASE, **change}, where="ckpt/config.json")
    assert message in str(err.value) and str(err.value).startswith("ckpt/config.json: ")


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(CheckpointError) as err:
        SparseMlaConfig.from_dict(
            {**BASE, "hidden_size": 0, "num_experts_per_tok": 9, "n_group": 3}
        )
    text = str(err.value)
    assert "hidden_size" in text and "num_experts_per_tok" in text and "n_group" in text
