"""Context rules: prompt + max_tokens must fit max_model_len; defaults follow OpenAI. vLLM's
sampling fields reach the engine's SamplingParams."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from loom_runtime.engine.types import SamplingParams
from loom_runtime.errors import InvalidRequestError, ModelNotFoundError
from loom_runtime.serve.prepare import (
    ModelLimits,
    check_model,
    prepare_chat,
    prepare_completion,
    resolve_max_tokens,
)
from loom_runtime.wire.openai.request import ChatCompletionRequest, CompletionRequest, parse_request

LIMITS = ModelLimits(model_name="tiny", max_model_len=100, vocab_size=500)

OK = [
    # (requested, default, prompt_len, expected)
    (None, 16, 10, 16),  # completions default
    (None, 16, 95, 5),  # default clamped to the room left
    (None, None, 10, 90),  # chat default: the rest of the context
    (90, 16, 10, 90),  # exactly fills the context
    (1, None, 99, 1),
]


@pytest.mark.parametrize(("requested", "default", "prompt_len", "expected"), OK)
def test_max_tokens_resolves(
    requested: int | None, default: int | None, prompt_len: int, expected: int
) -> None:
    assert resolve_max_tokens(requested, default, prompt_len, LIMITS, "prompt") == expected


BAD = [
    # (requested, prompt_len, param, words)
    (91, 10, "max_tokens", "at most 90"),
    (10**12, 10, "max_tokens", "lower max_tokens"),
    (None, 100, "prompt", "prompt has 100"),
    (5, 150, "prompt", "shorten the prompt"),
]


@pytest.mark.parametrize(("requested", "prompt_len", "param", "words"), BAD)
def test_too_long_requests_are_refused_naming_the_field(
    requested: int | None, prompt_len: int, param: str, words: str
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        resolve_max_tokens(requested, 16, prompt_len, LIMITS, "prompt")
    assert info.value.param == param
    assert words in str(info.value)
    assert "100" in str(info.value)  # the context length is stated


def test_unknown_model_is_refused_and_the_served_one_named() -> None:
    check_model("tiny", LIMITS)
    with pytest.raises(ModelNotFoundError, match="'tiny'"):
        check_model("gpt-4", LIMITS)


class _Tokenizer:
    def encode(self, text: str) -> Sequence[int]:
        return [1, 2, 3]

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Sequence[int]:
        return [1, 2]


VLLM_FIELDS = {"min_tokens": 3, "repetition_penalty": 1.3, "min_p": 0.05,
               "skip_special_tokens": False, "include_stop_str_in_output": True}  # fmt: skip


def test_vllm_sampling_fields_reach_the_engine_request() -> None:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 8, **VLLM_FIELDS}
    req = parse_request(CompletionRequest, json.dumps(body).encode())
    sampling = prepare_completion(req, _Tokenizer(), LIMITS, "r", 0.0)[0].sampling
    assert {k: getattr(sampling, k) for k in VLLM_FIELDS} == VLLM_FIELDS
    chat_body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **VLLM_FIELDS}
    chat = parse_request(ChatCompletionRequest, json.dumps(chat_body).encode())
    chat_sampling = prepare_chat(chat, _Tokenizer(), LIMITS, "r", 0.0)[0].sampling
    assert {k: getattr(chat_sampling, k) for k in VLLM_FIELDS} == VLLM_FIELDS
    # left out, they are vLLM's defaults: the engine's own defaults, which change nothing
    plain = parse_request(CompletionRequest, b'{"model": "tiny", "prompt": "hi"}')
    got = prepare_completion(plain, _Tokenizer(), LIMITS, "r", 0.0)[0].sampling
    assert {k: getattr(got, k) for k in VLLM_FIELDS} == {
        k: getattr(SamplingParams(), k) for k in VLLM_FIELDS
    }


def test_a_list_of_prompts_is_one_engine_request_each_in_order() -> None:
    body = {"model": "tiny", "prompt": ["hi", [7, 8, 9, 10]], "max_tokens": 4,
            "logit_bias": {"5": 1.5}}  # fmt: skip
    req = parse_request(CompletionRequest, json.dumps(body).encode())
    first, second = prepare_completion(req, _Tokenizer(), LIMITS, "cmpl-x", 0.0)
    assert (first.request_id, second.request_id) == ("cmpl-x-0", "cmpl-x-1")
    assert first.prompt_token_ids == (1, 2, 3) and second.prompt_token_ids == (7, 8, 9, 10)
    assert first.sampling == second.sampling and first.sampling.logit_bias == ((5, 1.5),)
    one = parse_request(CompletionRequest, b'{"model": "tiny", "prompt": ["hi"]}')
    assert [r.request_id for r in prepare_completion(one, _Tokenizer(), LIMITS, "r", 0.0)] == ["r"]


def test_a_list_of_prompts_cannot_be_disaggregated() -> None:
    body = {"model": "tiny", "prompt": ["a", "b"], "kv_transfer_params": {"do_remote_decode": True}}
    req = parse_request(CompletionRequest, json.dumps(body).encode())
    with pytest.raises(InvalidRequestError) as err:
        prepare_completion(req, _Tokenizer(), LIMITS, "r", 0.0)
    assert err.value.param == "kv_transfer_params"


def test_n_samples_of_each_prompt_share_the_first_ones_prefill_with_their_own_seeds() -> None:
    body = {"model": "tiny", "prompt": ["hi", [7, 8, 9]], "n": 3, "seed": 40, "max_tokens": 4}
    req = parse_request(CompletionRequest, json.dumps(body).encode())
    reqs = prepare_completion(req, _Tokenizer(), LIMITS, "c", 0.0)
    assert [r.request_id for r in reqs] == [f"c-{k}" for k in range(6)]
    assert [r.prompt_token_ids for r in reqs] == [(1, 2, 3)] * 3 + [(7, 8, 9)] * 3
    assert [r.sampling.seed for r in reqs] == [40, 41, 42] * 2
    assert [r.shares_prompt_of for r in reqs] == [None, "c-0", "c-0", None, "c-3", "c-3"]
    messages = [{"role": "user", "content": "hi"}]
    chat_body = {"model": "tiny", "messages": messages, "n": 2}
    chat = parse_request(ChatCompletionRequest, json.dumps(chat_body).encode())
    first, second = prepare_chat(chat, _Tokenizer(), LIMITS, "x", 0.0)
    assert (first.request_id, second.shares_prompt_of) == ("x-0", "x-0")
    assert first.sampling.seed is None and second.sampling.seed is None  # fresh entropy each


def test_prompt_log_probs_are_computed_by_every_sample_and_best_of_asks_for_log_probs() -> None:
    body = {"model": "tiny", "prompt": "hi", "n": 2, "prompt_logprobs": 1}
    reqs = prepare_completion(
        parse_request(CompletionRequest, json.dumps(body).encode()), _Tokenizer(), LIMITS, "c", 0
    )
    assert [r.shares_prompt_of for r in reqs] == [None, None]
    ranked = {"model": "tiny", "prompt": "hi", "n": 1, "best_of": 3}
    reqs = prepare_completion(
        parse_request(CompletionRequest, json.dumps(ranked).encode()), _Tokenizer(), LIMITS, "c", 0
    )
    assert len(reqs) == 3 and all(r.sampling.logprobs == 0 for r in reqs)


def test_only_the_first_sample_pulls_a_remote_prefill_and_a_prefill_takes_one_sample() -> None:
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_host": "h",
              "remote_port": 1, "remote_block_ids": [0], "remote_request_id": "p"}  # fmt: skip
    body = {"model": "tiny", "prompt": "hi", "n": 2, "kv_transfer_params": params}
    reqs = prepare_completion(
        parse_request(CompletionRequest, json.dumps(body).encode()), _Tokenizer(), LIMITS, "c", 0
    )
    assert reqs[0].kv_transfer is not None and reqs[1].kv_transfer is None
    assert reqs[1].shares_prompt_of == "c-0"
    prefill = {"model": "tiny", "prompt": "hi", "n": 2,
               "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
    with pytest.raises(InvalidRequestError) as err:
        prepare_completion(
            parse_request(CompletionRequest, json.dumps(prefill).encode()),
            _Tokenizer(), LIMITS, "c", 0,
        )  # fmt: skip
    assert err.value.param == "n"


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"n": 0}, "n", "greater than or equal to 1"),
        ({"n": 129}, "n", "less than or equal to 128"),
        ({"n": 3, "best_of": 2}, "best_of", "at least n"),
        ({"n": 1, "best_of": 2, "stream": True}, "best_of", "cannot be streamed"),
        ({"prompt": ["a"] * 3, "n": 100}, "n", "more than 256 sequences"),
    ],
)
def test_bad_choice_counts_are_refused_naming_the_field(
    body: dict[str, Any], param: str, words: str
) -> None:
    full = {"model": "tiny", "prompt": "hi"} | body
    with pytest.raises(InvalidRequestError) as err:
        parse_request(CompletionRequest, json.dumps(full).encode())
    assert err.value.param == param and words in str(err.value)
