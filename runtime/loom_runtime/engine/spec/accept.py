"""Which drafted tokens a speculative step keeps: greedy matching, and rejection sampling that
keeps the output distribution exactly the target model's.

Owns the arithmetic only (pure functions over one sequence's logits); never runs a model,
never touches a cache. Random draws use the sequence's own generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    """`accepted` drafts kept, then the target's own token after them: `tokens` is what the
    step emits (accepted + 1 tokens), and the KV of the rejected drafts is to be dropped."""

    accepted: int
    tokens: tuple[int, ...]


def accept_greedy(drafts: Sequence[int], target_ids: Sequence[int]) -> Verdict:
    """`target_ids[j]` is the target's greedy token after the context and drafts[:j]
    (len(drafts) + 1 of them): drafts are kept while they equal it, and the first one that
    differs is replaced by it, so the output is the target's greedy output token for token."""
    if len(target_ids) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} target tokens")
    a = 0
    while a < len(drafts) and drafts[a] == target_ids[a]:
        a += 1
    return Verdict(a, (*drafts[:a], target_ids[a]))


def accept_sampled(
    drafts: Sequence[int],
    target_probs: torch.Tensor,
    gen: torch.Generator,
    draft_probs: torch.Tensor | None = None,
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): draft j is kept with
    probability min(1, p_j(d) / q_j(d)); the first rejected one is replaced by a draw from the
    normalised max(0, p_j - q_j); if every draft is kept, a bonus token is drawn from p_k.
    The emitted tokens are then distributed exactly as sampling the target one by one.

    `target_probs` [k + 1, vocab] are the target's (already filtered) next-token probabilities
    after the context and drafts[:j]; `draft_probs` [k, vocab] the drafter's, or None when the
    drafts were argmax picks (a one-hot q: a draft is kept with probability p_j(d))."""
    k = len(drafts)
    if target_probs.shape[0] != k + 1 or (draft_probs is not None and draft_probs.shape[0] != k):
        raise ValueError(
            f"{k} drafts need [{k + 1}, vocab] target and [{k}, vocab] draft probabilities, got "
            f"{tuple(target_probs.shape)} and "
            f"{None if draft_probs is None else tuple(draft_probs.shape)}"
        )
    p_all = target_probs.to(torch.float64)
    for j, d in enumerate(drafts):
        p = p_all[j]
        q = _one_hot(d, p) if draft_probs is None else draft_probs[j].to(torch.float64)
        u = float(torch.rand((), dtype=torch.float64, generator=gen, device=gen.device))
        if u * float(q[d]) < float(p[d]):  # u < p/q without dividing by a zero q
            continue
        residual = torch.clamp(p - q, min=0.0)
        total = float(residual.sum())
        fixed = _draw(residual / total if total > 0.0 else p, gen)
        return Verdict(j, (*drafts[:j], fixed))
    return Verdict(k, (*drafts, _draw(p_all[k], gen)))


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def _draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    if probs.device != gen.device:
        probs = probs.to(gen.device)
    return int(torch.multinomial(probs, 1, generator=gen).item())
