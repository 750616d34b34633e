"""Turns a parsed OpenAI request into an EngineRequest: tokens, context checks, sampling params.

Owns the context-length and max_tokens rules; never talks to the engine or the network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.errors import InvalidRequestError, ModelNotFoundError
from loom_runtime.wire import context_length
from loom_runtime.wire.context_length import COMPLETIONS_DEFAULT_MAX_TOKENS
from loom_runtime.wire.kv_transfer import FIELD, KVTransferParams
from loom_runtime.wire.openai.choices import Choices
from loom_runtime.wire.openai.request import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)
from loom_runtime.wire.openai.structured import GrammarSpec
from loom_runtime.wire.prompt import template_message


class PromptTokenizer(Protocol):
    """What the server needs of the engine's tokenizer."""

    def encode(self, text: str) -> Sequence[int]: ...

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Sequence[int]: ...


@dataclass(frozen=True)
class ModelLimits:
    """The served model's name and the numbers requests are checked against."""

    model_name: str
    max_model_len: int  # prompt + output tokens
    vocab_size: int


def check_model(requested: str, limits: ModelLimits) -> None:
    if requested != limits.model_name:
        raise ModelNotFoundError(
            f"model {requested!r} is not served here; this worker serves {limits.model_name!r} "
            "(see GET /v1/models)"
        )


def resolve_max_tokens(
    requested: int | None, default: int | None, prompt_len: int, limits: ModelLimits, param: str
) -> int:
    """The context-length rule (loom_runtime.wire.context_length) against this model's limits."""
    return context_length.resolve_max_tokens(
        requested, default, prompt_len, limits.max_model_len, param
    )


def _check_token_ids(ids: Sequence[int], limits: ModelLimits) -> None:
    bad = [t for t in ids if t >= limits.vocab_size]
    if bad:
        raise InvalidRequestError(
            f"token id {bad[0]} is outside the vocabulary (size {limits.vocab_size})",
            param="prompt",
        )


def _sampling(
    req: CompletionRequest | ChatCompletionRequest,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    grammar: GrammarSpec | None = None,
) -> SamplingParams:
    """The engine's sampling params. spaces_between_special_tokens is accepted and has no
    effect: Loom detokenizes with the checkpoint's fast tokenizer (tokenizer.json), whose decode
    has no such option, as with vLLM's fast detokenizer."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=max(req.top_k, 0),
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        seed=req.seed,
        behaviour=req.return_behaviour,
        stop=req.stop,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        logprobs=logprobs,
        logit_bias=tuple((int(k), float(v)) for k, v in (req.logit_bias or {}).items()),
        prompt_logprobs=prompt_logprobs,
        grammar=grammar or req.grammar,
    )


def _transfer(req: CompletionRequest | ChatCompletionRequest) -> KVTransferParams | None:
    """The request's P/D instructions; a prefill for a remote decode must not stream (its
    answer, the lease, travels in the response body)."""
    if req.kv_transfer_params is None:
        return None
    params = KVTransferParams.parse(req.kv_transfer_params)
    if params.do_remote_decode and req.stream:
        raise InvalidRequestError(
            f"{FIELD}.do_remote_decode needs stream: false; the prefill answers with "
            f"{FIELD} in the response body",
            param="stream",
        )
    return params if params.is_transfer else None


def prepare_completion(
    req: CompletionRequest,
    tokenizer: PromptTokenizer,
    limits: ModelLimits,
    request_id: str,
    arrival: float,
) -> tuple[EngineRequest, ...]:
    """One engine request per sample of each prompt, in choice order (choices.py numbers and
    names them). `arrival` is time.monotonic() when the HTTP request came in."""
    check_model(req.model, limits)
    transfer = _transfer(req)
    if len(req.prompt) > 1 and req.kv_transfer_params is not None:
        raise InvalidRequestError(
            f"{FIELD} takes one prompt: a list of prompts is prefilled where it is decoded",
            param=FIELD,
        )
    # echo with max_tokens 0 answers the prompt alone: one token is run and not returned (vLLM)
    requested = 1 if req.max_tokens == 0 else req.max_tokens
    # best_of ranks samples by their log-probabilities: each sample reports its own
    logprobs = 0 if req.logprobs is None and req.samples > req.n else req.logprobs
    prompts = []
    for prompt in req.prompt:
        ids = _prompt_ids(prompt, tokenizer, limits)
        max_tokens = resolve_max_tokens(
            requested, COMPLETIONS_DEFAULT_MAX_TOKENS, len(ids), limits, "prompt"
        )
        prompts.append((ids, _sampling(req, max_tokens, logprobs, req.num_prompt_logprobs)))
    return fan_out(prompts, choices_of(req), request_id, arrival, transfer)


def choices_of(req: CompletionRequest | ChatCompletionRequest) -> Choices:
    prompts = len(req.prompt) if isinstance(req, CompletionRequest) else 1
    return Choices(prompts, req.n, req.samples)


def fan_out(
    prompts: Sequence[tuple[tuple[int, ...], SamplingParams]],
    choices: Choices,
    request_id: str,
    arrival: float,
    transfer: KVTransferParams | None,
) -> tuple[EngineRequest, ...]:
    """Each prompt's samples as engine requests: each its own seed; every sample after the
    first waits for the first's prompt KV and shares it (not when prompt log-probs are asked
    for: those need every position computed). Only the first sample of a P/D decode pulls."""
    if choices.samples > 1 and transfer is not None and transfer.do_remote_decode:
        raise InvalidRequestError(
            f"a prefill for a remote decode ({FIELD}) answers one sample: send n 1 (the decode "
            "samples the n choices from the one prefilled prompt)",
            param="n",
        )
    out = []
    for k in range(choices.total):
        ids, sampling = prompts[choices.prompt_of(k)]
        leader = choices.leader_of(k)
        position = k % choices.samples
        own = replace(sampling, seed=Choices.seed(sampling.seed, position))
        shares = None
        if leader is not None and sampling.prompt_logprobs is None:
            shares = choices.engine_id(request_id, leader)
        out.append(
            EngineRequest(
                choices.engine_id(request_id, k),
                ids,
                own,
                arrival_time=arrival,
                kv_transfer=transfer if leader is None else None,
                shares_prompt_of=shares,
            )
        )
    return tuple(out)


def _prompt_ids(
    prompt: str | tuple[int, ...], tokenizer: PromptTokenizer, limits: ModelLimits
) -> tuple[int, ...]:
    if isinstance(prompt, str):
        ids = tuple(tokenizer.encode(prompt))
    else:
        ids = prompt
        _check_token_ids(ids, limits)
    if not ids:
        raise InvalidRequestError("the prompt encodes to no tokens", param="prompt")
    return ids


def prepare_chat(
    req: ChatCompletionRequest,
    tokenizer: PromptTokenizer,
    limits: ModelLimits,
    request_id: str,
    arrival: float,
) -> tuple[EngineRequest, ...]:
    """One engine request per choice (n), in choice order."""
    check_model(req.model, limits)
    tools = list(req.tool_plan.tools) if req.tools is not None else None
    messages = chat_messages(req.messages)
    extra = req.chat_template_kwargs
    ids = tuple(tokenizer.encode_chat(messages, req.add_generation_prompt, tools, extra))
    if not ids:
        raise InvalidRequestError("the messages encode to no tokens", param="messages")
    max_tokens = resolve_max_tokens(req.requested_max_tokens, None, len(ids), limits, "messages")
    sampling = _sampling(
        req, max_tokens, req.num_logprobs, req.prompt_logprobs, grammar=req.output_grammar
    )
    return fan_out([(ids, sampling)], choices_of(req), request_id, arrival, _transfer(req))


def chat_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """A request's messages as the chat template sees them (with their calls and call ids)."""
    return [
        template_message(
            m.role,
            m.content,
            m.name,
            None if m.tool_calls is None else [c.model_dump() for c in m.tool_calls],
            m.tool_call_id,
        )
        for m in messages
    ]
