"""Sampling: greedy, temperature, top-k, top-p, per-request seeded generators and logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from loom_runtime.engine.sampler import filtered_probs, make_generator, sample, token_logprob
from loom_runtime.engine.types import SamplingParams


def rows(n: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_greedy_takes_the_argmax_of_each_row() -> None:
    logits = rows(4)
    got = sample(logits, [SamplingParams(temperature=0.0)] * 4, [None] * 4)
    assert [t.token_id for t in got] == logits.argmax(-1).tolist()
    assert all(t.logprob is None for t in got)


def test_top_k_one_is_greedy_even_with_temperature() -> None:
    logits = rows(3, seed=1)
    params = [SamplingParams(temperature=5.0, top_k=1)] * 3
    got = sample(logits, params, [make_generator(i) for i in range(3)])
    assert [t.token_id for t in got] == logits.argmax(-1).tolist()


def test_top_k_and_top_p_keep_only_the_allowed_tokens() -> None:
    row = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    p_k = filtered_probs(row, SamplingParams(temperature=1.0, top_k=2))
    assert (p_k[2:] == 0).all() and p_k[:2].sum().item() == pytest.approx(1.0)
    full = torch.softmax(row, -1)
    # top_p just above the first token's mass keeps exactly the first two
    p_p = filtered_probs(row, SamplingParams(temperature=1.0, top_p=float(full[0]) + 1e-6))
    assert (p_p > 0).tolist() == [True, True, False, False, False]
    # top_p below the first token's mass still keeps the most likely token
    p_one = filtered_probs(row, SamplingParams(temperature=1.0, top_p=0.01))
    assert p_one.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_temperature_sharpens_and_flattens() -> None:
    row = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)
    cold = filtered_probs(row, SamplingParams(temperature=0.5))
    hot = filtered_probs(row, SamplingParams(temperature=2.0))
    assert cold[0] > torch.softmax(row, -1)[0] > hot[0]


def test_seeded_draws_repeat_and_do_not_depend_on_the_batch() -> None:
    logits = rows(3, vocab=1000, seed=2)
    p = SamplingParams(temperature=1.0, seed=7)
    alone = [sample(logits[2:3], [p], [make_generator(7)])[0].token_id for _ in range(2)]
    in_batch = sample(logits, [p, p, p], [make_generator(1), make_generator(2), make_generator(7)])
    assert alone[0] == alone[1] == in_batch[2].token_id
    # the generator advances: a request's successive draws are not all the same
    gen = make_generator(7)
    draws = {sample(logits[2:3], [p], [gen])[0].token_id for _ in range(20)}
    assert len(draws) > 1


def test_sampling_without_a_generator_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a generator"):
        sample(rows(1), [SamplingParams(temperature=1.0)], [None])


def test_logprobs_are_the_raw_log_softmax_with_sorted_alternatives() -> None:
    row = rows(1, seed=3)[0]
    lp = torch.log_softmax(row, -1)
    got = sample(row[None], [SamplingParams(temperature=0.0, logprobs=3)], [None])[0]
    assert got.logprob is not None
    assert got.logprob.token_id == got.token_id == int(row.argmax())
    assert got.logprob.logprob == pytest.approx(float(lp.max()))
    ids = [t for t, _ in got.logprob.top]
    assert ids == torch.topk(lp, 3).indices.tolist()
    values = [v for _, v in got.logprob.top]
    assert values == sorted(values, reverse=True) and sum(math.exp(v) for v in values) < 1
    # temperature does not change reported logprobs (they are of the raw logits)
    hot = token_logprob(row, 5, 0)
    assert hot.logprob == pytest.approx(float(lp[5])) and hot.top == ()
