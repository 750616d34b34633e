"""The sampler's behaviour log-prob: each sampled token's log-prob under the exact distribution
it was drawn from (temperature, filters, logit_bias, penalties), 0.0 for a greedy pick; asking for
it changes no draw; and the loop reports it per token with the generator's seed."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from loom_runtime.engine.sampler import (
    TokenHistory,
    adjusted_logits,
    filtered_probs,
    generator_seed,
    make_generator,
    sample,
)
from loom_runtime.engine.types import SamplingParams


def rows(n: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def draw(logits: torch.Tensor, params: SamplingParams, seed: int = 7) -> list[tuple[int, float]]:
    got = sample(
        logits, [params] * len(logits), [make_generator(seed + i) for i in range(len(logits))]
    )
    assert all(t.behaviour_logprob is not None for t in got)
    return [(t.token_id, float(t.behaviour_logprob or 0.0)) for t in got]


def test_at_temperature_one_without_filters_it_is_the_raw_log_softmax() -> None:
    logits = rows(6)
    for i, (token, lp) in enumerate(draw(logits, SamplingParams(behaviour=True))):
        assert lp == float(torch.log_softmax(logits[i], dim=-1)[token])


def test_at_temperature_t_it_is_the_log_softmax_of_the_logits_over_t() -> None:
    logits = rows(6, seed=1)
    for i, (token, lp) in enumerate(draw(logits, SamplingParams(temperature=0.6, behaviour=True))):
        assert abs(lp - float(torch.log_softmax(logits[i] / 0.6, dim=-1)[token])) <= 1e-12


def test_filters_renormalise_over_the_kept_tokens() -> None:
    logits = rows(8, seed=2)
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.01, behaviour=True)
    for i, (token, lp) in enumerate(draw(logits, params)):
        p = filtered_probs(logits[i], params)
        assert p[token] > 0 and abs(lp - math.log(float(p[token]))) <= 1e-12
        raw = float(torch.log_softmax(logits[i] / 0.8, dim=-1)[token])
        assert lp > raw  # the dropped tokens' mass is given to the kept ones


def test_logit_bias_and_repetition_penalty_are_in_the_distribution() -> None:
    logits = rows(1, seed=3)
    params = SamplingParams(logit_bias=((4, 5.0),), repetition_penalty=1.3, behaviour=True)
    history = TokenHistory([1, 2, 3], 3)
    (tok,) = sample(logits, [params], [make_generator(0)], [history])
    expected = torch.log_softmax(adjusted_logits(logits[0], params, history), dim=-1)
    assert tok.behaviour_logprob == float(expected[tok.token_id])
    assert tok.behaviour_logprob != float(torch.log_softmax(logits[0], dim=-1)[tok.token_id])


def test_a_greedy_pick_has_log_prob_zero_and_no_seed() -> None:
    params = SamplingParams(temperature=0.0, behaviour=True)
    (tok,) = sample(rows(1), [params], [None])
    assert tok.behaviour_logprob == 0.0
    assert generator_seed(params) is None


def test_asking_for_the_record_changes_no_draw() -> None:
    logits = rows(16, seed=4)
    params = SamplingParams(temperature=0.9, top_p=0.95)
    off = sample(logits, [params] * 16, [make_generator(i) for i in range(16)])
    on = sample(
        logits, [replace(params, behaviour=True)] * 16, [make_generator(i) for i in range(16)]
    )
    assert [t.token_id for t in on] == [t.token_id for t in off]
    assert all(t.behaviour_logprob is None for t in off)


def test_an_unseeded_record_gets_a_seed_it_can_send_back() -> None:
    params = SamplingParams(behaviour=True)
    seeds = {generator_seed(params) for _ in range(4)}
    assert len(seeds) == 4 and all(s is not None and 0 <= s < 2**63 for s in seeds)
    assert generator_seed(replace(params, seed=-3)) == -3
    assert generator_seed(SamplingParams()) is None  # no record: fresh entropy, as before
