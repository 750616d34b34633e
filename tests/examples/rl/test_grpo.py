"""The RL example's GRPO math: the reward, group-normalised advantages, the trainer's log-probs
of sampled tokens and the direction of the policy loss's gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from examples.rl.grpo import group_advantages, policy_loss, punctuation_ids, reward, token_logprobs
from tokenizers import Tokenizer

from loom_runtime.models.tiny import init_tiny


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [((), 0.0), ((1, 2, 3, 4), 0.5), ((1, 1), 1.0), ((5, 6), 0.0)],
)
def test_the_reward_is_the_fraction_of_target_tokens(
    tokens: tuple[int, ...], expected: float
) -> None:
    assert reward(tokens, {1, 3}) == expected


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [
        ((0.5, 0.5, 0.5), (0.0, 0.0, 0.0)),
        ((0.0, 1.0), (-1.0, 1.0)),
        ((0.0, 0.0, 0.0, 1.0), (-(3**-0.5), -(3**-0.5), -(3**-0.5), 3**0.5)),
    ],
)
def test_advantages_are_normalised_within_the_group(
    rewards: tuple[float, ...], expected: tuple[float, ...]
) -> None:
    assert group_advantages(rewards) == pytest.approx(expected, abs=1e-5)


def test_punctuation_ids_are_the_tokens_without_letters_or_digits(tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_file(str(init_tiny(tmp_path / "tiny") / "tokenizer.json"))
    ids = punctuation_ids(tokenizer)
    texts = {tokenizer.decode([i]) for i in ids}
    assert {".", ",", "!", "?"} <= texts
    assert not any(c.isalnum() for t in texts for c in t)
    assert all(t.strip() for t in texts)
    assert 0.05 < len(ids) / tokenizer.get_vocab_size() < 0.2


class Bigram(torch.nn.Module):
    """A model whose logits depend on the last token only (enough to check positions)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, dtype=torch.float64))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
        class Out:
            logits = self.table[input_ids]

        return Out()


def test_token_logprobs_score_each_completion_token_after_its_prefix() -> None:
    model = Bigram(5)
    got = token_logprobs(model, [[1, 2], [3]], [[4, 0, 2], [1]])
    table = torch.log_softmax(model.table.detach(), dim=-1)
    assert torch.equal(got[0].detach(), torch.stack([table[2, 4], table[4, 0], table[0, 2]]))
    assert torch.equal(got[1].detach(), table[3, 1].reshape(1))


def test_the_loss_raises_the_log_prob_of_positive_advantages_and_lowers_negative_ones() -> None:
    logps = [torch.zeros(3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    loss = policy_loss(logps, [torch.zeros(3, dtype=torch.float64)] * 2, [1.0, -1.0])
    torch.autograd.backward(loss)
    assert logps[0].grad is not None and logps[1].grad is not None
    assert (logps[0].grad < 0).all() and (logps[1].grad > 0).all()  # descent raises the first
