"""Speculative acceptance: greedy verdicts keep the target's greedy tokens; rejection sampling
emits tokens distributed as the target's own (checked by frequency over seeded trials)."""

from __future__ import annotations

import pytest
import torch

from loom_runtime.engine.spec.accept import Verdict, accept_greedy, accept_sampled

TRIALS = 4000
FIRST = 0.03  # ~4 standard deviations of a frequency near 0.5 over TRIALS draws
SECOND = 0.06  # a second token comes in 30-60 % of the trials only


def test_greedy_keeps_drafts_until_the_first_mismatch_and_replaces_it() -> None:
    assert accept_greedy([5, 6, 7], [5, 6, 9, 1]) == Verdict(2, (5, 6, 9))
    assert accept_greedy([5, 6, 7], [4, 6, 7, 1]) == Verdict(0, (4,))
    assert accept_greedy([5, 6, 7], [5, 6, 7, 1]) == Verdict(3, (5, 6, 7, 1))


def test_greedy_needs_one_target_token_more_than_drafts() -> None:
    with pytest.raises(ValueError, match="2 drafts need 3 target tokens"):
        accept_greedy([1, 2], [1, 2])


def _frequencies(
    target: torch.Tensor, draft: torch.Tensor | None, seed: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Over TRIALS steps with drafts drawn from `draft` (argmax picks when None): how often
    each token came first, second (when a second was emitted), and the mean tokens kept."""
    gen = torch.Generator().manual_seed(seed)
    vocab = target.shape[1]
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    kept = 0
    for _ in range(TRIALS):
        if draft is None:
            drafts = [1, 1]
        else:
            drafts = [int(torch.multinomial(draft[j], 1, generator=gen)) for j in range(2)]
        verdict = accept_sampled(drafts, target, gen, draft)
        kept += verdict.accepted
        first[verdict.tokens[0]] += 1
        if len(verdict.tokens) > 1:
            second[verdict.tokens[1]] += 1
    return first / first.sum(), second / second.sum(), kept / TRIALS


TARGET = torch.tensor(
    [[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64
)


def test_rejection_sampling_emits_the_targets_distribution() -> None:
    draft = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.4, 0.4, 0.1, 0.1]], dtype=torch.float64)
    first, second, kept = _frequencies(TARGET, draft, seed=0)
    assert torch.allclose(first, TARGET[0].float(), atol=FIRST), first
    assert torch.allclose(second, TARGET[1].float(), atol=SECOND), second
    assert 0.0 < kept < 2.0  # some drafts kept, some rejected: both paths ran


def test_argmax_drafts_are_kept_with_the_targets_probability_of_them() -> None:
    first, second, kept = _frequencies(TARGET, None, seed=1)  # drafts are always token 1
    assert torch.allclose(first, TARGET[0].float(), atol=FIRST), first
    assert torch.allclose(second, TARGET[1].float(), atol=SECOND), second
    assert kept == pytest.approx(0.3 + 0.3 * 0.2, abs=FIRST)


def test_a_draft_the_target_can_never_pick_is_always_replaced() -> None:
    target = torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=torch.float64)
    verdict = accept_sampled([0], target, torch.Generator().manual_seed(0))
    assert verdict == Verdict(0, (1,))


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="2 drafts need"):
        accept_sampled([1, 2], TARGET[:2], torch.Generator())
