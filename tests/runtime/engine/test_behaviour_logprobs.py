"""The sampler's behaviour log-prob: each sampled token's log-prob under the exact distribution
it was drawn from (temperature, filters, logit_bias, penalties), 0.0 for a greedy pick; asking for
it changes no draw; and the engine reports it per token with the generator's seed, the same
alone or in a batch."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from tests.runtime.engine.conftest import random_prompt

from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.sampler import (
    TokenHistory,
    adjusted_logits,
    filtered_probs,
    generator_seed,
    make_generator,
    sample,
)
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import LoadedModel


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


def test_a_llama_record_does_not_depend_on_who_shares_the_batch(tiny64: LoadedModel) -> None:
    """float64 llama: a request's record alone equals its record among others within 1e-12 (the
    C2 gate holds in a batch; sparse-mla's float32 expert routing moves it ~1e-7, docs/rl.md)."""
    params = SamplingParams(max_tokens=10, temperature=0.8, seed=3, ignore_eos=True, behaviour=True)
    mine = EngineRequest("mine", random_prompt(50, 1), params)
    others = [EngineRequest(f"o{i}", random_prompt(20 + 30 * i, 10 + i),
                            SamplingParams(max_tokens=10, seed=i, ignore_eos=True))
              for i in range(4)]  # fmt: skip
    alone = serve(tiny64, [mine])["mine"]
    together = serve(tiny64, [mine, *others])["mine"]
    assert together.output_token_ids == alone.output_token_ids
    assert alone.seed == together.seed == 3
    gaps = [abs(a - b) for a, b in zip(alone.behaviour_logprobs, together.behaviour_logprobs,
                                        strict=True)]  # fmt: skip
    assert len(gaps) == 10 and max(gaps) <= 1e-12


def serve(loaded: LoadedModel, reqs: list[EngineRequest]) -> dict[str, CompletedRequest]:
    engine = Engine(loaded, EngineConfig(dtype=torch.float64, max_model_len=256, num_blocks=64))
    got = {r.request_id: OutputCollector(r) for r in reqs}
    for r in reqs:
        engine.add_request(r, got[r.request_id])
    while not all(c.done.is_set() for c in got.values()):
        engine.step()
    return {k: c.result() for k, c in got.items()}
