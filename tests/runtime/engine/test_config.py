"""EngineConfig: KV sizing from blocks, bytes or the default, and the settings it refuses."""

from __future__ import annotations

import pytest

from loom_runtime.engine.config import EngineConfig


def test_num_blocks_is_taken_as_given() -> None:
    assert EngineConfig(num_blocks=40).resolve_num_blocks(1000, 512) == 40


def test_kv_cache_gib_is_divided_into_blocks() -> None:
    assert EngineConfig(kv_cache_gib=10_500 / 2**30).resolve_num_blocks(1000, 16) == 10


def test_default_holds_a_quarter_of_max_model_len_per_sequence() -> None:
    cfg = EngineConfig(max_num_seqs=8, block_size=16)
    assert cfg.resolve_num_blocks(1000, 1024) == 8 * 1024 // 4 // 16
    # never below one full-length request
    assert EngineConfig(max_num_seqs=1).resolve_num_blocks(1000, 1024) == 1024 // 16


def test_too_small_a_cache_for_one_request_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold one request"):
        EngineConfig(num_blocks=3).resolve_num_blocks(1000, 64)


def test_max_model_len_defaults_to_the_model_and_cannot_exceed_it() -> None:
    assert EngineConfig().resolve_max_model_len(8192) == 8192
    assert EngineConfig(max_model_len=100).resolve_max_model_len(8192) == 100
    with pytest.raises(ValueError, match="exceeds"):
        EngineConfig(max_model_len=10_000).resolve_max_model_len(8192)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_blocks": 4, "kv_cache_gib": 1.0},
        {"kv_cache_gib": 1e-12},
        {"block_size": 0},
        {"max_num_seqs": 0},
        {"max_num_batched_tokens": 0},
        {"num_blocks": 0},
        {"max_model_len": 1},
        {"idle_wait_s": 0.0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="EngineConfig"):
        EngineConfig(**kwargs)  # type: ignore[arg-type]
