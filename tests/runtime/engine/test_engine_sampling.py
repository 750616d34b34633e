"""Sampling through the engine: seeds make draws reproducible, logprobs match the plain path,
stop strings and stop tokens end a request with its text trimmed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from loom_runtime.engine.ar_decode import CompletedRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import LoadedModel

Prompt = Callable[[int, int], tuple[int, ...]]
Greedy = Callable[..., SamplingParams]
Plain = Callable[[EngineRequest], CompletedRequest]


@pytest.fixture
def engine(tiny64: LoadedModel) -> Engine:
    return Engine(tiny64, EngineConfig(dtype=torch.float64, max_model_len=256, num_blocks=64))


def sampled(seed: int | None, n: int = 12) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True)


def together(
    engine: Engine, p: tuple[int, ...], params: list[SamplingParams]
) -> list[tuple[int, ...]]:
    """Output tokens of one request per params, all run in the same batches."""
    reqs = [EngineRequest(f"s{i}", p, sp) for i, sp in enumerate(params)]
    got = [OutputCollector(r) for r in reqs]
    for r, c in zip(reqs, got, strict=True):
        engine.add_request(r, c)
    while engine.step():
        pass
    return [c.result().output_token_ids for c in got]


def test_a_seed_reproduces_the_draws_and_another_seed_does_not(
    engine: Engine, prompt: Prompt
) -> None:
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    a, b, c, g, x, y = together(
        engine,
        prompt(12, 1),
        [sampled(3), sampled(3), sampled(4), greedy, sampled(None), sampled(None)],
    )
    assert a == b and a != c and a != g
    assert x != y  # without a seed every request draws fresh entropy
    # the same seed alone (another batch composition) draws the same tokens
    assert engine.generate(prompt(12, 1), sampled(3)).output_token_ids == a


def test_logprobs_match_the_plain_path(
    engine: Engine, prompt: Prompt, greedy: Greedy, plain: Plain
) -> None:
    req = EngineRequest("lp", prompt(20, 2), greedy(6, logprobs=4))
    got = engine.generate(req.prompt_token_ids, req.sampling)
    ref = plain(req)
    assert len(got.logprobs) == 6
    for tok, lp, ref_lp in zip(got.output_token_ids, got.logprobs, ref.logprobs, strict=True):
        assert lp.token_id == tok and len(lp.top) == 4
        assert lp.top[0][0] == tok and lp.top[0][1] == pytest.approx(lp.logprob)  # greedy: top one
        assert lp.logprob == pytest.approx(ref_lp.logprob, abs=1e-9)
        assert [t for t, _ in lp.top] == [t for t, _ in ref_lp.top]


def test_stop_strings_and_stop_tokens_finish_with_stop(
    engine: Engine, prompt: Prompt, greedy: Greedy
) -> None:
    p = prompt(10, 3)
    full = engine.generate(p, greedy(20))
    text = full.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = text.find(stop)
    by_string = engine.generate(p, greedy(20, stop=(stop,)))
    assert by_string.finish_reason == "stop" and by_string.text == text[:cut]
    assert len(by_string.output_token_ids) < 20
    token = full.output_token_ids[7]
    by_token = engine.generate(p, greedy(20, stop_token_ids=(token,)))
    first = full.output_token_ids.index(token)
    assert by_token.finish_reason == "stop"
    assert by_token.output_token_ids == full.output_token_ids[: first + 1]
