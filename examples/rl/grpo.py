"""The GRPO math of the RL example in plain torch: a verifiable reward, group-normalised
advantages, the trainer's own log-probs of the sampled tokens and the clipped policy loss.

Owns the numbers of one training step; never talks to the fleet (rollouts.py does) and never
steps an optimizer (train.py does).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import torch
from tokenizers import Tokenizer


def punctuation_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """The ids of tokens made of punctuation only (spaces allowed, no letter or digit): about
    one token in ten of the tiny model's vocabulary."""
    out = set()
    for i in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([i])
        if text.strip() and not any(c.isalnum() for c in text):
            out.add(i)
    return frozenset(out)


def reward(token_ids: Sequence[int], target: Collection[int]) -> float:
    """The verifiable reward: the fraction of sampled tokens in `target` (0 when none)."""
    if not token_ids:
        return 0.0
    return sum(1 for t in token_ids if t in target) / len(token_ids)


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GRPO's advantages: each reward minus its group's mean, over the group's standard
    deviation (all zero when the group's rewards are equal: nothing to learn from it)."""
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def token_logprobs(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """The model's log-prob of each completion token after its prompt and the tokens before it,
    in one right-padded batch (one tensor per sequence, with gradients)."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        positions = torch.arange(len(p) - 1, len(p) + len(c) - 1)
        out.append(logp[i, positions, torch.tensor(list(c), dtype=torch.long)])
    return out


def policy_loss(
    logps: Sequence[torch.Tensor],
    behaviour: Sequence[torch.Tensor],
    advantages: Sequence[float],
    clip: float = 0.2,
) -> torch.Tensor:
    """GRPO's clipped surrogate, averaged over each sequence's tokens, then over sequences.

    `behaviour` holds the log-probs the fleet reported when it sampled: on-policy (the fleet
    serves the trainer's weights) the ratio is exactly 1 and this is the plain policy gradient.
    """
    per_seq = []
    for logp, old, adv in zip(logps, behaviour, advantages, strict=True):
        ratio = torch.exp(logp - old)
        clipped = torch.clamp(ratio, 1 - clip, 1 + clip)
        per_seq.append(-torch.minimum(ratio * adv, clipped * adv).mean())
    return torch.stack(per_seq).mean()
