"""Sampling through the engine: seeds make draws reproducible, logprobs match the plain path,
stop strings and stop tokens end a request with its text trimmed, and vLLM's min_tokens,
repetition_penalty, min_p, skip_special_tokens and include_stop_str_in_output take effect."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.models.batch import ForwardBatch
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


def test_min_tokens_masks_a_stop_token_until_reached(
    engine: Engine, prompt: Prompt, greedy: Greedy
) -> None:
    p = prompt(10, 4)
    full = engine.generate(p, greedy(20)).output_token_ids
    token = full[3]
    first = full.index(token)
    stopped = engine.generate(p, greedy(20, stop_token_ids=(token,)))
    assert stopped.output_token_ids == full[: first + 1]
    held = engine.generate(p, greedy(20, stop_token_ids=(token,), min_tokens=first + 3))
    out = held.output_token_ids
    assert out[:first] == full[:first]  # nothing but the stop id was masked
    assert token not in out[: first + 3] and len(out) >= first + 3
    assert held.finish_reason == "length" or (out[-1] == token and len(out) > first + 3)


def test_min_tokens_keeps_stop_strings_from_ending_the_request(
    engine: Engine, prompt: Prompt, greedy: Greedy
) -> None:
    p = prompt(10, 3)
    text = engine.generate(p, greedy(12)).text
    stop = text[2:4]
    assert engine.generate(p, greedy(12, stop=(stop,))).finish_reason == "stop"
    held = engine.generate(p, greedy(12, stop=(stop,), min_tokens=12))
    assert held.finish_reason == "length" and stop in held.text


def test_repetition_penalty_steers_greedy_away_from_every_seen_token(
    engine: Engine, prompt: Prompt, greedy: Greedy
) -> None:
    p = prompt(10, 3)
    plain_out = engine.generate(p, greedy(20)).output_token_ids
    assert len(set(plain_out)) < 20  # the tiny model repeats itself greedily
    out = engine.generate(p, greedy(20, repetition_penalty=1.5)).output_token_ids
    assert out[0] == plain_out[0]  # an unseen top token is untouched
    assert len(set(out)) == 20 and not set(out) & set(p)  # prompt and output both count
    assert engine.generate(p, greedy(20, repetition_penalty=1.0)).output_token_ids == plain_out


def test_min_p_one_keeps_only_the_top_token(engine: Engine, prompt: Prompt, greedy: Greedy) -> None:
    p = prompt(10, 3)
    want = engine.generate(p, greedy(20)).output_token_ids
    drawn = replace(sampled(5, 20), top_p=1.0)
    assert engine.generate(p, drawn).output_token_ids != want
    assert engine.generate(p, replace(drawn, min_p=1.0)).output_token_ids == want


def test_special_tokens_and_a_stop_tokens_text_are_kept_when_asked(
    engine: Engine, tiny64: LoadedModel, prompt: Prompt, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model is made to want EOS (<|im_end|>) every step; min_tokens holds it off twice."""
    eos = tiny64.tokenizer.token_id("<|im_end|>")
    assert eos in tiny64.tokenizer.eos_token_ids
    forward = tiny64.model.forward

    def wants_eos(batch: ForwardBatch, kv: PagedKVCache) -> torch.Tensor:
        logits = forward(batch, kv)
        logits[:, eos] += 1e4
        return logits

    monkeypatch.setattr(tiny64.model, "forward", wants_eos)
    p = prompt(10, 3)
    base = SamplingParams(max_tokens=8, temperature=0.0, min_tokens=2)
    cases = {
        (True, False): "",  # vLLM's defaults: skipped, and a stop token's text is never kept
        (True, True): "",  # kept, but special: skipped
        (False, False): "",  # shown, but a stop token's text is not kept
        (False, True): "<|im_end|>",
    }
    for (skip, include), tail in cases.items():
        sampling = replace(base, skip_special_tokens=skip, include_stop_str_in_output=include)
        got = engine.generate(p, sampling)
        assert got.finish_reason == "stop" and len(got.output_token_ids) == 3
        assert got.output_token_ids[-1] == eos and eos not in got.output_token_ids[:2]
        assert got.text == tiny64.tokenizer.decode(got.output_token_ids[:2]) + tail


def test_logit_bias_forces_a_token_bans_another_and_leaves_batch_mates_alone(
    engine: Engine, prompt: Prompt, greedy: Greedy
) -> None:
    p = prompt(10, 4)
    plain_out = engine.generate(p, greedy(8)).output_token_ids
    forced = 7 if plain_out[0] != 7 else 8
    banned = plain_out[0]
    biased = [
        greedy(8, logit_bias=((forced, 100.0),)),
        greedy(8, logit_bias=((banned, -100.0),)),
    ]
    a, b, c, d = together(engine, p, [greedy(8), biased[0], greedy(8), biased[1]])
    assert b == (forced,) * 8  # +100 wins every greedy step
    assert banned not in d and d != plain_out  # -100 bans it
    assert a == c == plain_out  # the requests without a bias are token-identical to alone
