"""The router's top-k gating equals transformers' GlmMoeDsaTopkRouter, and follows the
DeepSeek-V3 rules: group-limited choice, bias for the choice only, renormalised, scaled."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.ffn import MoeFfn
from loom_runtime.models.sparse_mla.gating import Routing, route
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla


def by_expert(routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
    order = routing.experts.argsort(dim=-1)
    return routing.experts.gather(1, order), routing.weights.gather(1, order)


def moe_of(ours: LoadedSparseMla, layer: int) -> MoeFfn:
    ffn = ours.model.layers[layer].ffn
    assert isinstance(ffn, MoeFfn)
    return ffn


def test_routing_equals_transformers_router(ours: LoadedSparseMla, reference: Any) -> None:
    h = torch.randn(256, ours.config.hidden_size, dtype=torch.float64)
    moe = moe_of(ours, 1)
    experts, weights = by_expert(route(h, moe.gate, moe.correction_bias, ours.config))
    with torch.no_grad():
        _, hf_weights, hf_experts = reference.model.layers[1].mlp.gate(h)
    hf_experts, hf_weights = by_expert(Routing(hf_experts, hf_weights))
    assert torch.equal(experts, hf_experts)
    assert torch.equal(weights, hf_weights)


def test_choice_stays_within_the_best_group(ours: LoadedSparseMla) -> None:
    config = ours.config
    moe = moe_of(ours, 2)
    routing = route(torch.randn(512, config.hidden_size), moe.gate, moe.correction_bias, config)
    per_group = config.n_routed_experts // config.n_group
    groups = routing.experts // per_group
    assert config.topk_group == 1 and torch.equal(groups, groups[:, :1].expand_as(groups))
    assert groups.unique().numel() == config.n_group  # both groups get chosen by some tokens


def test_bias_moves_the_choice_but_not_the_weights() -> None:
    config = SparseMlaConfig(
        vocab_size=8, hidden_size=2, intermediate_size=4, moe_intermediate_size=4,
        num_hidden_layers=1, num_attention_heads=1, q_lora_rank=2, kv_lora_rank=2,
        qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, n_routed_experts=4,
        num_experts_per_tok=2, index_topk=1, index_head_dim=2, index_n_heads=1,
        indexer_types=("full",), mlp_layer_types=("sparse",), routed_scaling_factor=2.0,
    )  # fmt: skip
    h = torch.tensor([[1.0, 0.0]])
    weight = torch.tensor([[3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    plain = route(h, weight, torch.zeros(4), config)
    assert sorted(plain.experts[0].tolist()) == [0, 1]
    biased = route(h, weight, torch.tensor([0.0, 0.0, 0.0, 1.0]), config)
    experts, weights = by_expert(biased)
    assert experts[0].tolist() == [0, 3]
    scores = torch.sigmoid(torch.tensor([3.0, 0.0]))  # unbiased scores of experts 0 and 3
    assert torch.allclose(weights[0], 2.0 * scores / scores.sum())
    unnormalised = route(
        h, weight, torch.zeros(4), dataclasses.replace(config, norm_topk_prob=False)
    )
    assert torch.allclose(
        by_expert(unnormalised)[1][0], 2.0 * torch.sigmoid(torch.tensor([3.0, 2.0]))
    )
