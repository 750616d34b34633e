"""What Loom does with every request field vLLM 0.33.0 or OpenAI defines for /v1/completions,
/v1/chat/completions and /v1/responses, and that OpenAI defines for /v1/images/generations and
/v1/videos: honoured, refused (a 400 naming it) or accepted as meaningless, with why.

Owns the one definition of that contract (request.py enforces it, docs/openai-fields.md is
generated from it); never parses a body beyond the top-level keys it judges.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from loom_runtime.errors import InvalidRequestError

Status = Literal["honoured", "refused", "meaningless"]
Endpoint = Literal["completion", "chat", "responses", "images", "videos"]


@dataclass(frozen=True)
class FieldRule:
    """One field's status and why. A refused field is still accepted at null or at one of
    `off` (the values that ask for nothing); any other value is a 400 whose message is `why`,
    which says what to do instead."""

    status: Status
    why: str
    off: tuple[Any, ...] = ()

    def refuses(self, value: Any) -> bool:
        if self.status != "refused" or value is None:
            return False
        return not any(type(value) is type(o) and value == o for o in self.off)


def _h(why: str) -> FieldRule:
    return FieldRule("honoured", why)


def _m(why: str) -> FieldRule:
    return FieldRule("meaningless", why)


def _r(why: str, *off: Any) -> FieldRule:
    return FieldRule("refused", why, off)


_PENALTY = _r(
    "presence and frequency penalties are not implemented: leave it at 0 "
    "(repetition_penalty is honoured)",
    0,
    0.0,
)
_MEDIA = _m("the routes take text only, so there is no media for it to act on")

SHARED: Mapping[str, FieldRule] = {
    "model": _h("must name the served model (GET /v1/models); another name is a 404"),
    "temperature": _h("0 is greedy"),
    "top_p": _h("nucleus filtering"),
    "top_k": _h("vLLM extension; 0 or -1 is off"),
    "min_p": _h("vLLM extension; 0 is off"),
    "seed": _h("the request's own generator; same seed, same tokens"),
    "stop": _h("up to 16 strings"),
    "stop_token_ids": _h("vLLM extension"),
    "ignore_eos": _h("vLLM extension"),
    "min_tokens": _h("vLLM extension: EOS and stop ids are masked until this many tokens"),
    "repetition_penalty": _h("vLLM extension; 1 is off"),
    "skip_special_tokens": _h("vLLM extension"),
    "include_stop_str_in_output": _h("vLLM extension"),
    "logit_bias": _h("token id (as a string) -> bias in [-100, 100], added to the logits"),
    "stream": _h("server-sent events"),
    "stream_options": _h("include_usage, and vLLM's continuous_usage_stats"),
    "max_tokens": _h("the output budget; checked against max_model_len"),
    "logprobs": _h("the sampled token's log-prob and the top alternatives"),
    "return_token_ids": _h("vLLM extension: prompt_token_ids and token_ids in the answer"),
    "kv_transfer_params": _h("vLLM's P/D object (NixlConnector), set by the router"),
    "user": _m("an end-user id for a provider's abuse monitoring; Loom keeps no per-user state"),
    "spaces_between_special_tokens": _m(
        "Loom detokenizes with the checkpoint's fast tokenizer, which has no such option "
        "(as vLLM's fast detokenizer)"
    ),
    "session_id": _m("vLLM's session label; it does not change the output"),
    "stream_interval": _m(
        "only how many tokens a streamed chunk carries; Loom sends each step's tokens as they "
        "come and the text is the same"
    ),
    "media_io_kwargs": _MEDIA,
    "mm_processor_kwargs": _MEDIA,
    "mm_payload": _m("shapes vLLM's /render answer, which Loom does not serve"),
    "return_mm_kwargs": _m("shapes vLLM's /render answer, which Loom does not serve"),
    "n": _h(
        "1..128 choices per prompt, each sampled with its own generator (seed + its position "
        "when seeded); the prompt is prefilled once and its full blocks shared from the prefix "
        "cache; streamed choices interleave by index"
    ),
    "frequency_penalty": _PENALTY,
    "presence_penalty": _PENALTY,
    "use_beam_search": _r("beam search is not implemented: sample instead", False),
    "length_penalty": _r("beam search only, which is not implemented: leave it out", 1, 1.0),
    "watermarking": _r("watermarking is not implemented: leave it out"),
    "truncate_prompt_tokens": _r("prompt truncation is not implemented: shorten the prompt"),
    "truncation_side": _r("prompt truncation is not implemented: leave it out"),
    "logprob_token_ids": _r("log-probs of chosen ids are not implemented: use logprobs"),
    "allowed_token_ids": _r("an allow-list of ids is not implemented: use logit_bias"),
    "bad_words": _r("bad_words is not implemented: ban their ids with logit_bias -100", []),
    "response_format": _h(
        "text, json_object or json_schema (its schema enforced exactly, strict or not): a "
        "token mask in the batched sampler (xgrammar); structural_tag is a 400"
    ),
    "structured_outputs": _h(
        "vLLM's object: json, regex, choice, grammar (xgrammar's EBNF, or Lark) or "
        "json_object, with disable_any_whitespace; disable_additional_properties (make "
        "additionalProperties default to false) is already Loom's default (xgrammar's strict "
        "mode, as vLLM's xgrammar backend); structural_tag and whitespace_pattern are a 400"
    ),
    "priority": _r("priority scheduling is not implemented (first come, first served)", 0),
    "request_id": _r("send the request id as the X-Request-Id header instead"),
    "return_tokens_as_token_ids": _r("not implemented: use return_token_ids", False),
    "return_weight_versions": _h(
        "vLLM extension: each choice's weight_versions, [{version, start, end}] over its output "
        "tokens (streamed: on the choice's last chunk); return_behaviour implies it"
    ),
    "return_behaviour": _h(
        "Loom extension: the behaviour record of each choice (docs/rl.md): its token_ids and "
        "prompt_token_ids (as return_token_ids), weight_versions (as return_weight_versions) "
        "and `behaviour`: {seed, logprobs}, each output token's log-prob under the exact "
        "distribution it was drawn from (temperature, top-p/top-k/min-p, logit_bias, "
        "penalties and grammar mask applied; 0.0 when greedy); streamed: each chunk's own"
    ),
    "routed_experts_prompt_start": _r("routed-expert data is not returned: leave it out", 0),
    "return_token_offsets": _r("token offsets are not returned: leave it out", False),
    "cache_salt": _r("prefix-cache salting is not implemented: leave it out"),
    "ec_transfer_params": _r("encoder-cache disaggregation is not implemented: leave it out"),
    "vllm_xargs": _r("Loom has no custom extensions that read vllm_xargs: leave it out", {}),
    "repetition_detection": _r("repetition detection is not implemented: leave it out"),
    "thinking_token_budget": _r("reasoning budgets are not implemented: leave it out"),
}

COMPLETION: Mapping[str, FieldRule] = {
    **SHARED,
    "prompt": _h("a string or token ids, or a list of them: one choice each, index in order"),
    "logprobs": _h("0..20 top alternatives per token"),
    "echo": _h(
        "the prompt's text before the output's, and with logprobs its tokens' log-probs (the "
        "first null) before the output's, as lm-evaluation-harness reads them; max_tokens 0 "
        "returns the prompt alone. Streamed: the first chunk of each choice is the prompt"
    ),
    "prompt_logprobs": _h(
        "0..20: vLLM's prompt_logprobs on the choice (streamed: on its first chunk), one entry "
        "per prompt token (the first null), computed in the prefill; under P/D the router "
        "prefills it where it decodes"
    ),
    "best_of": _h(
        "n..128 samples per prompt, the n with the highest cumulative log-probability returned "
        "(usage counts every sample); above n it is not streamed (a 400 says so)"
    ),
    "suffix": _r("suffix (insertion) is not implemented: leave it out", ""),
    "add_special_tokens": _r(
        "a text prompt is always encoded with the tokenizer's special tokens (e.g. BOS): "
        "send token ids to control them",
        True,
    ),
    "prompt_embeds": _r("prompt embeddings are not accepted: send text or token ids"),
}

CHAT: Mapping[str, FieldRule] = {
    **SHARED,
    "messages": _h(
        "system, developer (rendered as system where the template has no such role), user, "
        "assistant (with tool_calls, whose arguments the template sees as JSON) and tool "
        "(with tool_call_id) text messages"
    ),
    "logprobs": _h("true: the sampled token's log-prob (top_logprobs for alternatives)"),
    "top_logprobs": _h("0..20 top alternatives per token; needs logprobs"),
    "max_completion_tokens": _h("OpenAI's name for max_tokens; wins when both are given"),
    "add_generation_prompt": _h("render the template's assistant header (default true)"),
    "metadata": _m("tags for OpenAI's stored completions; Loom stores nothing"),
    "store": _m("OpenAI's stored completions; Loom stores nothing and serves no such API"),
    "service_tier": _m("OpenAI's processing tier; Loom has one"),
    "safety_identifier": _m("an end-user id for a provider's abuse monitoring"),
    "prompt_cache_key": _m("a cache-routing hint; Loom's router routes by the prompt's prefix"),
    "prompt_cache_options": _m("OpenAI's cache breakpoints; Loom caches every full block"),
    "prompt_cache_retention": _m("OpenAI's cache lifetime; Loom's cache evicts by use"),
    "prediction": _m("a latency hint (predicted output); the output does not depend on it"),
    "tools": _h(
        "function tools, rendered by the checkpoint's chat template (docs/tools.md); the "
        "assistant's tool_calls and tool messages in the history too"
    ),
    "tool_choice": _h(
        "auto (the model's calls read by its tool-call parser), none, required or a named "
        "function (the output held to the call's JSON schema by the grammar mask)"
    ),
    "parallel_tool_calls": _h("false: one call at most (required's array holds one item)"),
    "functions": _r("the legacy functions field is not implemented (as in vLLM): use tools"),
    "function_call": _r(
        "the legacy function_call field is not implemented (as in vLLM): use tool_choice", "none"
    ),
    "audio": _r("audio output is not supported: the model answers in text"),
    "modalities": _r("only text output is supported", ["text"]),
    "moderation": _r("moderation is not implemented: leave it out"),
    "verbosity": _r("verbosity is not implemented: leave it out"),
    "web_search_options": _r("web search is not implemented: leave it out"),
    "reasoning_effort": _r("reasoning effort is not implemented: leave it out"),
    "include_reasoning": _h(
        "vLLM extension: false drops the reasoning a reasoning parser read out (docs/tools.md)"
    ),
    "echo": _r("vLLM's chat echo (prepending the last message) is not implemented", False),
    "prompt_logprobs": _h(
        "0..20: vLLM's prompt_logprobs of the rendered prompt, top-level on the response (one "
        "entry per prompt token, the first null), computed in the prefill; not streamed (a "
        "400 says so); under P/D the router prefills it where it decodes"
    ),
    "continue_final_message": _r(
        "continuing the final message is not implemented: leave it out", False
    ),
    "add_special_tokens": _r(
        "the chat template adds the special tokens; extra ones are not implemented", False
    ),
    "documents": _r("RAG documents for the template are not implemented: leave it out"),
    "chat_template": _r("the checkpoint's own chat template is used: leave it out"),
    "chat_template_kwargs": _h(
        "variables the chat template reads (e.g. enable_thinking); the ones the request sets "
        "itself (messages, tools, add_generation_prompt, special tokens) are a 400"
    ),
    "return_prompt_text": _r("the rendered prompt is not returned: leave it out", False),
}

RESPONSES_AS_CHAT = (
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "ignore_eos", "repetition_penalty", "skip_special_tokens", "include_stop_str_in_output",
    "logit_bias", "user", "spaces_between_special_tokens", "session_id", "media_io_kwargs",
    "mm_processor_kwargs", "mm_payload", "return_mm_kwargs", "frequency_penalty",
    "presence_penalty", "watermarking", "structured_outputs", "priority", "request_id",
    "cache_salt", "ec_transfer_params", "vllm_xargs", "tools", "parallel_tool_calls",
    "include_reasoning", "safety_identifier", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "moderation", "chat_template_kwargs",
)  # fmt: skip
"""Fields /v1/responses takes as chat does (a response runs as a chat request)."""

RESPONSES: Mapping[str, FieldRule] = {
    **{name: CHAT[name] for name in RESPONSES_AS_CHAT},
    "input": _h(
        "a string, or items: messages (system, developer, user, assistant; input_text and "
        "output_text parts), function_call and function_call_output"
    ),
    "instructions": _h("a system message before the input; not carried to the next response"),
    "max_output_tokens": _h("as chat's max_completion_tokens; the rest of the context if unset"),
    "previous_response_id": _h(
        "continue a stored response: its input and output come before this input (the worker "
        "keeps the last 1,024; an unknown or evicted id is a 404)"
    ),
    "store": _h("false: the response is not kept, so nothing can continue it"),
    "stream": _h("the Responses streaming events, sequence-numbered, response.completed last"),
    "metadata": _h("returned on the response as sent"),
    "text": _h("format text, json_object or json_schema (held to it by the grammar mask)"),
    "tool_choice": _h("auto, none, required or a function by name, as chat's"),
    "kv_transfer_params": _r(
        "a response is prefilled where it is decoded (no P/D two-step on /v1/responses)"
    ),
    "background": _r("background responses are not implemented: leave it out", False),
    "include": _r("no include option is implemented: leave it out", []),
    "max_tool_calls": _r("built-in tools are not implemented: leave it out"),
    "prompt": _r("stored prompt templates are not implemented: send input"),
    "reasoning": _r("reasoning options are not implemented: leave it out"),
    "service_tier": _r("Loom has one tier", "auto", "default"),
    "top_logprobs": _r("log-probs are not returned on /v1/responses: use chat", 0),
    "return_behaviour": _r(
        "behaviour records are returned on /v1/completions and /v1/chat/completions: use chat",
        False,
    ),
    "truncation": _r("the input is never truncated: a too-long input is a 400", "disabled"),
    "conversation": _r("the Conversations API is not implemented: use previous_response_id"),
    "context_management": _r("context management is not implemented: leave it out"),
    "stream_options": _r("stream obfuscation is not implemented: leave it out", {}),
    "image": _r("image generation is not a Responses tool here: leave it out"),
    "access_programs": _r("access programs are not implemented: leave it out"),
    "enable_response_messages": _r("vLLM's harmony message echo is not implemented", False),
    "previous_input_messages": _r("vLLM's harmony message input is not implemented: use input"),
}

_NOT_DRAWN = "not implemented: leave it out"

MEDIA: Mapping[str, FieldRule] = {
    "model": _h(
        "the served model (at the router also a workflow, docs/composite.md; GET /v1/models "
        "lists them); another name is a 404"
    ),
    "prompt": _h(
        "the text prompt, cut to the text encoder's length as diffusers' Wan pipelines do (a "
        "card with a program thinks on it first and draws from the thought)"
    ),
    "size": _h("WIDTHxHEIGHT in pixels (default 512x512)"),
    "seed": _h(
        "Loom extension: the request's own generator (random when unset); same seed, same frames"
    ),
    "negative_prompt": _h("Loom extension: the unconditional prompt of classifier-free guidance"),
    "guidance_scale": _h("Loom extension: above 1 turns classifier-free guidance on (default 1)"),
    "num_inference_steps": _h("Loom extension: denoising steps (default: the card's)"),
    "user": _m("an end-user id for a provider's abuse monitoring; Loom keeps no per-user state"),
}

IMAGES: Mapping[str, FieldRule] = {
    **MEDIA,
    "n": _h("1..10 images, seeded seed, seed + 1, …; a card with a program draws one"),
    "response_format": _h("b64_json (Loom keeps no images to link to: url is a 400)"),
    "safety_identifier": _m("an end-user id for a provider's abuse monitoring"),
    "moderation": _m("Loom moderates no content, at any level"),
    "quality": _r(
        "quality levels are not implemented: set num_inference_steps instead", "auto", "standard"
    ),
    "style": _r("styles are not implemented: say the style in the prompt"),
    "background": _r("background control is not implemented: leave it out", "auto"),
    "output_format": _r("images are PNGs: leave it out", "png"),
    "output_compression": _r("PNGs have no compression level: leave it out", 100),
    "partial_images": _r("partial images are not streamed: leave it out", 0),
    "stream": _r("image streaming is not implemented: leave it out", False),
    "complexity": _r(f"complexity is {_NOT_DRAWN}"),
    "frame_count": _r("animated images are not implemented: ask /v1/videos for frames"),
    "frame_duration_ms": _r("animated images are not implemented: ask /v1/videos for frames"),
    "svg": _r(f"vector output is {_NOT_DRAWN}"),
}

VIDEOS: Mapping[str, FieldRule] = {
    **MEDIA,
    "seconds": _h("frames = seconds × fps + 1 (num_frames wins when both are given)"),
    "num_frames": _h("Loom extension: the frame count itself"),
    "fps": _h("Loom extension: frames per second of the MP4 (default 16)"),
    "input_reference": _r(f"image-to-video is {_NOT_DRAWN}"),
}

CONTRACTS: Mapping[Endpoint, Mapping[str, FieldRule]] = {
    "completion": COMPLETION,
    "chat": CHAT,
    "responses": RESPONSES,
    "images": IMAGES,
    "videos": VIDEOS,
}


def refused_field(endpoint: Endpoint, body: Mapping[str, Any]) -> InvalidRequestError | None:
    """The error for the first field of `body` (in body order) that `endpoint` refuses."""
    rules = CONTRACTS[endpoint]
    for key, value in body.items():
        rule = rules.get(key)
        if rule is not None and rule.refuses(value):
            return InvalidRequestError(f"{key} is not supported: {rule.why}", param=key)
    return None
