"""The architecture block: gqa and mla need their own dimensions; heads come in groups."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom_runtime.card import Architecture, CardError
from loom_runtime.card.load import parse_card


def _arch(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "numLayers": 4,
        "hiddenSize": 64,
        "numAttentionHeads": 8,
        "numKeyValueHeads": 2,
        "headDim": 8,
        "attention": {"kind": "gqa"},
    }
    data.update(changes)
    return data


def _paths(data: dict[str, Any]) -> list[str]:
    with pytest.raises(CardError) as info:
        parse_card(Architecture, data)
    return [e.path for e in info.value.errors]


def test_gqa_architecture_parses_with_snake_case_attributes() -> None:
    arch = parse_card(Architecture, _arch(vocabSize=1000))
    assert (arch.num_key_value_heads, arch.head_dim, arch.vocab_size) == (2, 8, 1000)
    assert arch.attention.quant_group_size == 128


def test_gqa_needs_kv_heads_and_head_dim() -> None:
    data = _arch()
    del data["numKeyValueHeads"], data["headDim"]
    assert _paths(data) == ["numKeyValueHeads", "headDim"]


def test_mla_needs_latent_and_rope_dims() -> None:
    data = _arch(attention={"kind": "mla"})
    assert _paths(data) == ["attention.kvLoraRank", "attention.qkRopeHeadDim"]


def test_mla_with_its_dims_parses() -> None:
    arch = parse_card(
        Architecture,
        _arch(
            numLayers=78,
            numAttentionHeads=64,
            attention={"kind": "mla", "kvLoraRank": 512, "qkRopeHeadDim": 64},
            indexer={"numLayers": 21, "headDim": 128, "topK": 2048},
            mtp={"numLayers": 1, "draftTokens": 3},
        ),
    )
    assert arch.attention.kv_lora_rank == 512
    assert arch.indexer is not None and arch.indexer.top_k == 2048
    assert arch.mtp is not None and arch.mtp.draft_tokens == 3


def test_indexer_cannot_have_more_layers_than_the_model() -> None:
    data = _arch(indexer={"numLayers": 5, "headDim": 128, "topK": 64})
    assert _paths(data) == ["indexer.numLayers"]


def test_head_rule_still_reported_when_another_field_has_a_type_error() -> None:
    data = _arch(numKeyValueHeads=3, hiddenSize="64")
    assert _paths(data) == ["hiddenSize", "numKeyValueHeads"]


@given(heads=st.integers(1, 64), kv_heads=st.integers(1, 64))
def test_gqa_heads_accepted_exactly_when_divisible(heads: int, kv_heads: int) -> None:
    data = _arch(numAttentionHeads=heads, numKeyValueHeads=kv_heads)
    if heads % kv_heads == 0:
        assert parse_card(Architecture, data).num_attention_heads == heads
    else:
        assert _paths(data) == ["numKeyValueHeads"]
