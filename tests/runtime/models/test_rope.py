"""RoPE frequencies and attention scale equal transformers' for every supported scaling type."""

from __future__ import annotations

import pytest
import torch

from loom_runtime.models.config import ModelConfig
from loom_runtime.models.rope import apply_rope, inverse_frequencies, rope_tables

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 40.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
        "beta_fast": 32,
        "beta_slow": 1,
        "original_max_position_embeddings": 512,
    },
}


def hf_config(scaling):
    import transformers

    return transformers.LlamaConfig(
        hidden_size=512,
        num_attention_heads=4,
        head_dim=128,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        rope_scaling=None if scaling is None else dict(scaling),
    )


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_inverse_frequencies_equal_transformers(name: str) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf = hf_config(SCALINGS[name])
    ours = ModelConfig.from_dict(hf.to_dict())
    inv_freq, scale = inverse_frequencies(
        ours.head_dim, ours.rope_theta, ours.rope_scaling, ours.max_position_embeddings
    )
    if name == "default":
        expected, expected_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(hf)
    elif name == "dynamic":  # applied statically at the longest context the scaling allows
        expected, expected_scale = ROPE_INIT_FUNCTIONS["dynamic"](hf, seq_len=4096 * 2)
    else:
        expected, expected_scale = ROPE_INIT_FUNCTIONS[SCALINGS[name]["rope_type"]](hf)
    assert inv_freq.dtype == torch.float32
    assert torch.equal(inv_freq, expected)
    assert scale == pytest.approx(expected_scale, rel=1e-12)
    if name != "default":
        assert not torch.equal(
            inv_freq, LlamaRotaryEmbedding.compute_default_rope_parameters(hf)[0]
        )


def test_apply_rope_preserves_norm_and_relative_positions() -> None:
    inv_freq, scale = inverse_frequencies(16, 10000.0, None, 128)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 16, generator=gen), torch.randn(1, 1, 16, generator=gen)

    def rotated(x, pos):
        return apply_rope(x, rope_tables(torch.tensor([pos]), inv_freq, scale, torch.float32))

    assert torch.allclose(rotated(q, 7).norm(), q.norm(), atol=1e-5)
    # q.k depends only on the distance between positions
    a = (rotated(q, 10) * rotated(k, 3)).sum()
    b = (rotated(q, 107) * rotated(k, 100)).sum()
    assert torch.allclose(a, b, atol=1e-4)
    assert torch.equal(rotated(q, 0), q)
