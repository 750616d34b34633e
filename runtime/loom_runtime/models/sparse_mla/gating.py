"""The MoE router's top-k gating (DeepSeek-V3 rules): sigmoid scores, a correction bias for the
choice only, group-limited selection, optional renormalisation, a routed scaling factor.

A pure function of the hidden states and the router's weights; never runs an expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loom_runtime.models.elementwise import each_element
from loom_runtime.models.linear import invariant_linear
from loom_runtime.models.sparse_mla.config import SparseMlaConfig

RENORM_EPS = 1e-20


@dataclass(frozen=True)
class Routing:
    """Per token, the k experts it goes to and the weight of each one's output."""

    experts: torch.Tensor  # [T, k] int64
    weights: torch.Tensor  # [T, k] float32


def route(
    h: torch.Tensor,
    weight: torch.Tensor,
    correction_bias: torch.Tensor,
    config: SparseMlaConfig,
    invariant: bool = False,
) -> Routing:
    """Gate tokens h ([T, hidden]) with the router weight ([E, hidden]), in float32.

    The bias shifts which experts are chosen but not their weights. Experts are first limited
    to the topk_group groups whose two best (biased) scores sum highest. `invariant`: each
    token's routing the same bits whatever tokens share the call (models/linear.py,
    models/elementwise.py).
    """
    c = config
    if invariant:  # batch-invariant mode: a row's scores the same bits in any batch
        scores = each_element(torch.sigmoid, invariant_linear(h.float(), weight.float(), None))
    else:
        scores = F.linear(h.float(), weight.float()).sigmoid()  # [T, E]
    for_choice = scores + correction_bias.float()
    grouped = for_choice.view(-1, c.n_group, c.n_routed_experts // c.n_group)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, n_group]
    best_groups = group_scores.topk(c.topk_group, dim=-1, sorted=False).indices
    allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
    allowed = allowed[:, :, None].expand_as(grouped).reshape_as(for_choice)
    for_choice = for_choice.masked_fill(~allowed, float("-inf"))
    experts = for_choice.topk(c.num_experts_per_tok, dim=-1, sorted=False).indices
    weights = scores.gather(1, experts)
    if c.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + RENORM_EPS)
    return Routing(experts=experts, weights=weights * c.routed_scaling_factor)
