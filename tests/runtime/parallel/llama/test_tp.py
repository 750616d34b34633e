"""A llama-family model's TP shard on real gloo ranks equals the whole model: float64 logits
within 1e-9 for a two-sequence prefill (paged, non-contiguous blocks) and a decode step, for
each variant of the family the shard must handle — plain llama, q/k/v biases (qwen2), o_proj
and MLP biases, qk-norm (qwen3), GQA at 4:1 and at 1:1 — on 2 ranks. A model that does not
split is refused with the reason."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loom_runtime.models.config import ModelConfig
from loom_runtime.parallel.layout import LayoutError
from loom_runtime.parallel.llama.tp import shard_config
from loom_runtime.parallel.ranks import RankConfig, run_ranks
from loom_runtime.testing.tp_programs import TpForward, tp_forward

BASE = ModelConfig(
    model_type="llama",
    vocab_size=50,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=8,
)
VARIANTS = {
    "llama-gqa4": BASE,
    "qwen2-qkv-bias": replace(BASE, model_type="qwen2", attention_bias=True),
    "o-and-mlp-bias": replace(BASE, attention_out_bias=True, mlp_bias=True),
    "qwen3-qk-norm": replace(BASE, model_type="qwen3", qk_norm=True, num_key_value_heads=8),
    "tied-head": replace(BASE, tie_word_embeddings=True),
}


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_a_tp2_shard_equals_the_whole_model(variant: str, tmp_path: Path) -> None:
    traces: list[TpForward] = run_ranks(
        RankConfig(world=2), tp_forward, VARIANTS[variant], 3, workdir=tmp_path, timeout_s=120
    )
    for trace in traces:
        assert trace.sharded.shape == trace.reference.shape == (19, BASE.vocab_size)
        assert (trace.sharded - trace.reference).abs().max().item() < 1e-9
    assert (traces[0].sharded - traces[1].sharded).abs().max().item() == 0  # all-reduced alike


def test_the_shard_config_halves_heads_and_columns_and_refuses_what_does_not_divide() -> None:
    half = shard_config(BASE, 2)
    assert (half.num_attention_heads, half.num_key_value_heads, half.intermediate_size) == (
        4,
        1,
        24,
    )
    assert half.head_dim == BASE.head_dim and half.hidden_size == BASE.hidden_size
    with pytest.raises(LayoutError, match=r"tp \(4\) must divide num_key_value_heads \(2\)"):
        shard_config(BASE, 4)
    with pytest.raises(LayoutError, match=r"intermediate_size \(48\)"):
        shard_config(BASE, 5)
