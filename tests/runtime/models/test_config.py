"""ModelConfig reads every config.json layout we serve and reports all problems at once."""

from __future__ import annotations

import json

import pytest
import torch

from loom_runtime.errors import CheckpointError
from loom_runtime.models.config import ModelConfig

BASE = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def test_legacy_rope_scaling_equals_transformers_v5_rope_parameters() -> None:
    legacy = {**BASE, "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    v5 = {**BASE, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "linear", "factor": 2.0}}
    a, b = ModelConfig.from_dict(legacy), ModelConfig.from_dict(v5)
    assert a == b
    assert a.rope_theta == 500000.0
    assert dict(a.rope_scaling or {}) == {"rope_type": "linear", "factor": 2.0}


def test_default_rope_is_none_and_llama3_gets_original_length() -> None:
    plain = ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_type": "default"}})
    assert plain.rope_scaling is None and plain.rope_theta == 10000.0
    llama3 = ModelConfig.from_dict(
        {
            **BASE,
            "max_position_embeddings": 8192,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            },
        }
    )
    assert llama3.rope_scaling is not None
    assert llama3.rope_scaling["original_max_position_embeddings"] == 8192
    with pytest.raises(TypeError):
        llama3.rope_scaling["factor"] = 1.0  # type: ignore[index]


def test_family_switches() -> None:
    qwen2 = ModelConfig.from_dict({**BASE, "model_type": "qwen2"})
    assert (qwen2.attention_bias, qwen2.attention_out_bias, qwen2.qk_norm) == (True, False, False)
    llama = ModelConfig.from_dict({**BASE, "attention_bias": True})
    assert (llama.attention_bias, llama.attention_out_bias) == (True, True)
    qwen3 = ModelConfig.from_dict({**BASE, "model_type": "qwen3", "head_dim": 32})
    assert qwen3.qk_norm and qwen3.head_dim == 32 and qwen3.q_size == 128
    assert ModelConfig.from_dict(BASE).head_dim == 16


def test_all_problems_are_reported_together() -> None:
    bad = {
        **BASE,
        "model_type": "gpt2",
        "num_key_value_heads": 3,
        "hidden_size": 0,
        "hidden_act": "gelu",
        "rope_scaling": {"rope_type": "longrope", "factor": 2.0},
    }
    with pytest.raises(CheckpointError) as info:
        ModelConfig.from_dict(bad, where="ckpt/config.json")
    message = str(info.value)
    for fragment in (
        "ckpt/config.json",
        "model_type 'gpt2'",
        "hidden_size",
        "num_key_value_heads",
        "hidden_act 'gelu'",
        "longrope",
    ):
        assert fragment in message


def test_sliding_window_is_refused() -> None:
    with pytest.raises(CheckpointError, match="sliding"):
        ModelConfig.from_dict({**BASE, "model_type": "qwen2", "use_sliding_window": True})
    with pytest.raises(CheckpointError, match="layer_types"):
        ModelConfig.from_dict({**BASE, "layer_types": ["full_attention", "sliding_attention"]})


def test_eos_ids_merge_config_and_generation_config(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({**BASE, "eos_token_id": 5, "bos_token_id": 1})
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 5]}))
    config = ModelConfig.from_dir(tmp_path)
    assert config.eos_token_ids == (5, 7)
    assert config.bos_token_id == 1


def test_missing_or_broken_config_json_is_a_checkpoint_error(tmp_path) -> None:
    with pytest.raises(CheckpointError, match=r"config\.json"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not readable JSON"):
        ModelConfig.from_dir(tmp_path)


def test_kv_spec_matches_the_architecture() -> None:
    spec = ModelConfig.from_dict(BASE).kv_spec(block_size=16, num_blocks=10, dtype=torch.bfloat16)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (2, 2, 16)
    assert (spec.block_size, spec.num_blocks, spec.dtype) == (16, 10, torch.bfloat16)
    assert spec.bytes_per_block == 2 * 2 * 16 * 2 * 16 * 2


@pytest.mark.parametrize(
    ("family", "extra"),
    [
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        ("qwen2", {}),
        ("qwen3", {"head_dim": 32, "tie_word_embeddings": True}),
    ],
)
def test_parameter_count_equals_transformers(family: str, extra: dict) -> None:
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }
    fields = {k: v for k, v in BASE.items() if k != "model_type"} | extra
    hf = classes[family][1](classes[family][0](**fields))
    assert ModelConfig.from_dict(hf.config.to_dict()).num_parameters == hf.num_parameters()
