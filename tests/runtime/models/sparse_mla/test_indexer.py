"""The DSA indexer selects what transformers' GlmMoeDsaIndexer selects on the same weights;
padding past the visible tokens is marked invalid; ties go to the earlier token."""

from __future__ import annotations

from typing import Any

import torch

from loom_runtime.models.sparse_mla.indexer import Indexer, Selection
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.models.sparse_mla.rotary import pair_tables

T = 200


def selected(selection: Selection, length: int) -> torch.Tensor:
    """[T, length] bool: which context rows each query attends to."""
    mask = torch.zeros(selection.indices.shape[0], length, dtype=torch.bool)
    return mask.scatter(1, selection.indices, selection.valid)


def test_selection_equals_transformers_indexer_on_the_same_weights(
    ours: LoadedSparseMla, reference: Any
) -> None:
    config = ours.config
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(T, config.hidden_size, generator=gen, dtype=torch.float64)
    q_resid = torch.randn(T, config.q_lora_rank, generator=gen, dtype=torch.float64)
    positions = torch.arange(T)
    for layer in config.full_indexer_layers:
        indexer = ours.model.layers[layer].indexer
        assert indexer is not None
        rope = pair_tables(positions, config.qk_rope_head_dim, config.rope_theta, torch.float64)
        keys = indexer.keys(h, rope)
        ours_mask = selected(indexer.select(h, q_resid, rope, keys, positions), T)

        hf_indexer = reference.model.layers[layer].self_attn.indexer
        cos_sin = reference.model.rotary_emb(h[None], positions[None])
        causal = torch.ones(T, T, dtype=torch.bool).tril()[None]
        with torch.no_grad():
            top = hf_indexer(h[None], q_resid[None], cos_sin, causal, positions[None])[0]
        hf_mask = torch.zeros(T, T, dtype=torch.bool).scatter(1, top.long(), True) & causal[0]

        assert torch.equal(ours_mask, hf_mask)
        counts = ours_mask.sum(-1)
        k = config.index_topk
        assert torch.equal(counts, torch.clamp(positions + 1, max=k))  # every row: min(p+1, k)


def test_rows_beyond_the_visible_tokens_are_padding(ours: LoadedSparseMla) -> None:
    config = ours.config
    indexer = ours.model.layers[0].indexer
    assert indexer is not None
    n = 5  # fewer tokens than index_topk: each query sees its p + 1 tokens, the rest is padding
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(n, config.hidden_size, generator=gen, dtype=torch.float64)
    q_resid = torch.randn(n, config.q_lora_rank, generator=gen, dtype=torch.float64)
    positions = torch.arange(n)
    rope = pair_tables(positions, config.qk_rope_head_dim, config.rope_theta, torch.float64)
    selection = indexer.select(h, q_resid, rope, indexer.keys(h, rope), positions)
    assert selection.indices.shape == (n, n)
    assert torch.equal(selected(selection, n), torch.ones(n, n, dtype=torch.bool).tril())


def test_equal_scores_select_the_earlier_tokens(ours: LoadedSparseMla) -> None:
    config = ours.config
    indexer = Indexer(config, torch.float64, "cpu")  # zero weights: every score is exactly 0
    n = config.index_topk * 2
    h = torch.randn(n, config.hidden_size, dtype=torch.float64)
    q_resid = torch.randn(n, config.q_lora_rank, dtype=torch.float64)
    positions = torch.arange(n)
    rope = pair_tables(positions, config.qk_rope_head_dim, config.rope_theta, torch.float64)
    selection = indexer.select(h, q_resid, rope, indexer.keys(h, rope), positions)
    last = selection.indices[-1]
    assert torch.equal(last, torch.arange(config.index_topk))
