"""Sampling: greedy, temperature, min-p, top-k, top-p, repetition penalty, min_tokens,
per-request seeded generators and logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from loom_runtime.engine.sampler import (
    TokenHistory,
    adjusted_logits,
    filtered_probs,
    make_generator,
    sample,
    token_logprob,
)
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


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_ids() -> None:
    row = _t(2.0, -1.0, 0.5, 3.0, -0.5)
    # prompt (0, 1), output (4, 0): seen = {0, 1, 4}, repeats count once
    history = TokenHistory([0, 1, 4, 0], num_prompt_tokens=2)
    got = adjusted_logits(row, SamplingParams(repetition_penalty=2.0), history)
    assert got.tolist() == [1.0, -2.0, 0.5, 3.0, -1.0]
    assert row.tolist() == [2.0, -1.0, 0.5, 3.0, -0.5]  # the logits themselves are untouched
    # below 1 it rewards repeats the same way round
    assert adjusted_logits(row, SamplingParams(repetition_penalty=0.5), history)[0] == 4.0


def test_repetition_penalty_changes_the_greedy_pick_and_only_the_pick() -> None:
    row = _t(3.0, 2.0, -1.0)
    history = TokenHistory([1, 0], num_prompt_tokens=1)  # 1 in the prompt, 0 generated
    p = SamplingParams(temperature=0.0, repetition_penalty=2.0, logprobs=1)
    (tok,) = sample(row[None], [p], [None], [history])
    assert tok.token_id == 0  # 3/2 = 1.5 still beats 2/2 = 1
    (tok,) = sample(row[None], [p], [None], [TokenHistory([0], num_prompt_tokens=1)])
    assert tok.token_id == 1  # 3/2 = 1.5 loses to an unseen 2.0
    assert tok.logprob is not None  # logprobs stay those of the raw logits (vLLM's default)
    assert tok.logprob.logprob == pytest.approx(float(torch.log_softmax(row, -1)[1]))


def test_defaults_leave_the_row_itself_and_the_greedy_pick_unchanged() -> None:
    logits = rows(3, seed=4)
    history = TokenHistory(list(range(50)), num_prompt_tokens=10, stop_token_ids=frozenset({1}))
    row = logits[0]
    assert adjusted_logits(row, SamplingParams(), history) is row  # no copy, no arithmetic
    greedy = SamplingParams(temperature=0.0)
    with_history = sample(logits, [greedy] * 3, [None] * 3, [history] * 3)
    assert [t.token_id for t in with_history] == logits.argmax(-1).tolist()


def test_min_tokens_masks_eos_and_stop_ids_until_that_many_were_generated() -> None:
    row = _t(0.0, 9.0, 1.0, 8.0, 2.0)  # 1 is EOS, 3 a stop id: both would win
    stops = frozenset({1, 3, 99})  # 99 is outside this vocabulary: ignored
    p = SamplingParams(temperature=0.0, min_tokens=2)
    picks = []
    for generated in range(4):
        history = TokenHistory([5] * (3 + generated), num_prompt_tokens=3, stop_token_ids=stops)
        picks.append(sample(row[None], [p], [None], [history])[0].token_id)
    assert picks == [4, 4, 1, 1]  # the 1st and 2nd tokens cannot stop; the 3rd may
    masked = adjusted_logits(row, p, TokenHistory([5], 1, stops))
    assert masked.tolist() == [0.0, -math.inf, 1.0, -math.inf, 2.0]


def test_min_tokens_mask_holds_for_seeded_draws_too() -> None:
    row = _t(50.0, 0.0, 0.0, 0.0)  # token 0 (EOS) is all but certain
    p = SamplingParams(temperature=1.0, seed=3, min_tokens=1)
    history = TokenHistory([2, 2], num_prompt_tokens=2, stop_token_ids=frozenset({0}))
    gen = make_generator(3)
    draws = {sample(row[None], [p], [gen], [history])[0].token_id for _ in range(30)}
    assert 0 not in draws and draws <= {1, 2, 3}


def test_min_p_drops_tokens_below_a_fraction_of_the_top_prob_after_temperature() -> None:
    row = _t(2.0, 1.0, 0.0)  # prob ratios to the top: e^-1 = 0.37, e^-2 = 0.14
    cold = filtered_probs(row, SamplingParams(temperature=1.0, min_p=0.3))
    assert (cold > 0).tolist() == [True, True, False]
    assert float(cold.sum()) == pytest.approx(1.0)
    assert float(cold[0] / cold[1]) == pytest.approx(math.e)  # the survivors keep their odds
    # temperature 2 flattens the ratios to e^-0.5 and e^-1 first: all three survive
    hot = filtered_probs(row, SamplingParams(temperature=2.0, min_p=0.3))
    assert (hot > 0).all()
    assert filtered_probs(row, SamplingParams(min_p=1.0)).tolist() == [1.0, 0.0, 0.0]


def test_histories_must_match_the_rows() -> None:
    with pytest.raises(ValueError, match="histories"):
        sample(rows(2), [SamplingParams(temperature=0.0)] * 2, [None] * 2, [None])


def test_logit_bias_is_added_to_its_row_only_and_logprobs_stay_raw() -> None:
    logits = rows(2, vocab=6, seed=3)
    bias = SamplingParams(temperature=0.0, logprobs=0, logit_bias=((5, 100.0), (0, -100.0)))
    plain = SamplingParams(temperature=0.0, logprobs=0)
    got = sample(logits, [bias, plain], [None, None])
    assert got[0].token_id == 5 and got[1].token_id == int(logits[1].argmax())
    adjusted = adjusted_logits(logits[0], bias, None)
    assert adjusted[5] == logits[0][5] + 100 and adjusted[0] == logits[0][0] - 100
    assert adjusted[1:5].tolist() == logits[0][1:5].tolist()
    raw = torch.log_softmax(logits[0], -1)[5].item()
    assert got[0].logprob is not None and got[0].logprob.logprob == pytest.approx(raw)
    second = logits[1]
    assert adjusted_logits(second, plain, None) is second  # no bias: no copy
