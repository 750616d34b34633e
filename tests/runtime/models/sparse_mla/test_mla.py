"""MLA attention (absorbed, over the selected latent rows) equals transformers'
GlmMoeDsaAttention (expanded keys and values, masked to the same rows) on the same weights."""

from __future__ import annotations

from typing import Any

import torch

from loom_runtime.models.sparse_mla.cache import LayerRows
from loom_runtime.models.sparse_mla.indexer import Selection
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.models.sparse_mla.rotary import pair_tables

T, K = 120, 24


def random_selection(gen: torch.Generator) -> torch.Tensor:
    """[T, K] distinct rows per query, always including itself; some may be in its future."""
    scores = torch.rand(T, T, generator=gen)
    scores.fill_diagonal_(2.0)
    return scores.topk(K, dim=-1).indices


def test_attention_over_selected_rows_equals_transformers(
    ours: LoadedSparseMla, reference: Any
) -> None:
    config = ours.config
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(T, config.hidden_size, generator=gen, dtype=torch.float64)
    positions = torch.arange(T)
    indices = random_selection(gen)
    layer = 1  # a shared-indexer layer: transformers takes the selection as given
    attention = ours.model.layers[layer].attention
    rope = pair_tables(positions, config.qk_rope_head_dim, config.rope_theta, torch.float64)
    latent, rope_keys = attention.latent(h, rope)
    selection = Selection(indices=indices, valid=indices <= positions[:, None])
    out = attention.attend(
        attention.queries(h, rope), LayerRows(latent, rope_keys, None), selection
    )

    hf_attention = reference.model.layers[layer].self_attn
    cos_sin = reference.model.rotary_emb(h[None], positions[None])
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        expected, _, _ = hf_attention(
            h[None], cos_sin, causal, prev_topk_indices=indices[None].to(torch.int32)
        )
    # transformers' SDPA on the CPU is accurate to ~1e-7 here even in float64
    assert (out - expected[0]).abs().max().item() < 1e-6
