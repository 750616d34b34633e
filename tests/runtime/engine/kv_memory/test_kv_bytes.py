"""The engine's KV figures (/metrics: loom:kv_cache_bytes, loom:kv_bytes_per_token) are what it
allocated, and equal what the capacity planner predicts for the same model, fp8 KV included."""

from __future__ import annotations

from loom_operator.fleet.kv_layout import GQAAttention, KVDtype, ModelShape, kv_bytes_per_token
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.config import ModelConfig
from loom_runtime.models.loader import LoadedModel


def planner_shape(loaded: LoadedModel, kv_dtype: KVDtype, group: int = 128) -> ModelShape:
    c = loaded.config
    assert isinstance(c, ModelConfig)
    return ModelShape(
        num_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        attention=GQAAttention(c.num_key_value_heads, c.head_dim),
        kv_dtype=kv_dtype,
        quant_group_size=group,
    )


def test_kv_bytes_are_the_allocated_pool_and_the_planners_per_token_figure(
    tiny32: LoadedModel,
) -> None:
    engine = Engine(tiny32, EngineConfig(num_blocks=40, block_size=16, max_model_len=640))
    stats = engine.stats()
    shape = planner_shape(tiny32, "fp32")  # the tiny model is float32, and so is its KV
    assert stats.kv_bytes_per_token == kv_bytes_per_token(shape) == 6 * 2 * 2 * 64 * 4
    assert stats.kv_cache_bytes == 40 * 16 * stats.kv_bytes_per_token


def test_fp8_kv_bytes_are_the_planners_fp8_figure(tiny32: LoadedModel) -> None:
    config = EngineConfig(num_blocks=40, block_size=16, max_model_len=640, kv_fp8=Fp8Format(32))
    engine = Engine(tiny32, config)
    stats = engine.stats()
    shape = planner_shape(tiny32, "fp8", group=32)
    assert stats.kv_bytes_per_token == kv_bytes_per_token(shape) == 6 * 2 * 2 * (64 + 2 * 4)
    assert stats.kv_cache_bytes == 40 * 16 * stats.kv_bytes_per_token
