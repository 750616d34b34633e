"""The MoE FFN (routed + shared experts) and the dense MLP equal transformers' GlmMoeDsaMoE and
GlmMoeDsaMLP on the same weights."""

from __future__ import annotations

from typing import Any

import torch

from loom_runtime.models.sparse_mla.loader import LoadedSparseMla


def test_moe_equals_transformers(ours: LoadedSparseMla, reference: Any) -> None:
    h = torch.randn(128, ours.config.hidden_size, dtype=torch.float64)
    for layer, kind in enumerate(ours.config.mlp_layer_types):
        out = ours.model.layers[layer].ffn.forward(h)
        with torch.no_grad():
            expected = reference.model.layers[layer].mlp(h[None])[0]
        assert (out - expected).abs().max().item() < 1e-12, (layer, kind)
    assert set(ours.config.mlp_layer_types) == {"dense", "sparse"}
