"""OpenAI request parsing: good bodies become typed requests, bad ones name the field at fault."""

from __future__ import annotations

import json

import pytest

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.request import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
    unknown_fields,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def _body(base: dict[str, object], **changes: object) -> bytes:
    return json.dumps({**base, **changes}).encode()


def test_completion_accepts_string_or_token_prompts_and_lists_of_them() -> None:
    assert parse_request(CompletionRequest, _body(COMPLETION)).prompt == ("hi",)
    assert parse_request(CompletionRequest, _body(COMPLETION, prompt=[1, 2])).prompt == ((1, 2),)
    assert parse_request(CompletionRequest, _body(COMPLETION, prompt=["x"])).prompt == ("x",)
    assert parse_request(CompletionRequest, _body(COMPLETION, prompt=[[3]])).prompt == ((3,),)
    both = parse_request(CompletionRequest, _body(COMPLETION, prompt=["a", [4, 5]])).prompt
    assert both == ("a", (4, 5))


def test_stop_string_becomes_a_tuple_and_stream_options_are_read() -> None:
    req = parse_request(
        CompletionRequest,
        _body(COMPLETION, stop="\n", stream=True, stream_options={"include_usage": True}),
    )
    assert req.stop == ("\n",)
    assert req.include_usage_chunk


def test_chat_content_parts_are_joined_and_max_completion_tokens_wins() -> None:
    req = parse_request(
        ChatCompletionRequest,
        _body(
            CHAT,
            messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                   {"type": "text", "text": "b"}]}],
            max_tokens=5,
            max_completion_tokens=7,
            logprobs=True,
            top_logprobs=3,
        ),
    )  # fmt: skip
    assert req.messages[0].content == "ab"
    assert req.requested_max_tokens == 7
    assert req.num_logprobs == 3


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "call-1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _named(name: str) -> dict[str, object]:
    return {"type": "function", "function": {"name": name}}


BAD = [
    # (request class, body, param, words the message must contain)
    (CompletionRequest, b"{not json", None, "not valid JSON"),
    (CompletionRequest, b"[1, 2]", None, "JSON object"),
    (CompletionRequest, _body({"prompt": "x"}), "model", "required"),
    (CompletionRequest, _body(COMPLETION, prompt=""), "prompt", "empty"),
    (CompletionRequest, _body(COMPLETION, prompt=[]), "prompt", "empty"),
    (CompletionRequest, _body(COMPLETION, prompt=[1, -2]), "prompt", "non-negative"),
    (CompletionRequest, _body(COMPLETION, prompt=["a", ""]), "prompt", "empty (prompt 1)"),
    (CompletionRequest, _body(COMPLETION, max_tokens=-1), "max_tokens", "greater than"),
    (CompletionRequest, _body(COMPLETION, max_tokens=0), "max_tokens", "only with echo"),
    (CompletionRequest, _body(COMPLETION, prompt_logprobs=21), "prompt_logprobs", "less than"),
    (CompletionRequest, _body(COMPLETION, max_tokens="9"), "max_tokens", "integer"),
    (CompletionRequest, _body(COMPLETION, temperature=-0.1), "temperature", "greater than"),
    (CompletionRequest, _body(COMPLETION, temperature=2.5), "temperature", "less than"),
    (CompletionRequest, _body(COMPLETION, top_p=0), "top_p", "greater than"),
    (CompletionRequest, _body(COMPLETION, top_p=1.5), "top_p", "less than"),
    (CompletionRequest, _body(COMPLETION, top_k=-2), "top_k", "greater than"),
    (CompletionRequest, _body(COMPLETION, n=129), "n", "less than or equal to 128"),
    (CompletionRequest, _body(COMPLETION, n=3, best_of=2), "best_of", "at least n"),
    (CompletionRequest, _body(COMPLETION, logprobs=21), "logprobs", "less than"),
    (CompletionRequest, _body(COMPLETION, presence_penalty=0.5), "presence_penalty", "penalties"),
    (CompletionRequest, _body(COMPLETION, logit_bias={"x": 5}), "logit_bias", "decimal"),
    (CompletionRequest, _body(COMPLETION, logit_bias={"1": -101}), "logit_bias", "[-100, 100]"),
    (CompletionRequest, _body(COMPLETION, logit_bias={"1": "5"}), "logit_bias.1", "number"),
    (CompletionRequest, _body(COMPLETION, stop=[""]), "stop", "non-empty"),
    (CompletionRequest, _body(COMPLETION, stream_options={}), "stream_options", "stream is true"),
    (CompletionRequest, _body(COMPLETION, seed=99999999999999999999999), "seed", "less than"),
    (CompletionRequest, _body(COMPLETION, seed=-(2**63) - 1), "seed", "greater than"),
    (CompletionRequest, _body(COMPLETION, prompt=5), "prompt", "string or a list"),
    (CompletionRequest, _body(COMPLETION, prompt=[-5]), "prompt", "item 0"),
    (CompletionRequest, _body(COMPLETION, prompt=[1, True]), "prompt", "item 1"),
    (CompletionRequest, _body(COMPLETION, prompt=[2**40]), "prompt", "item 0"),
    (CompletionRequest, _body(COMPLETION, prompt=[[1], [-2]]), "prompt", "(prompt 1)"),
    (CompletionRequest, _body(COMPLETION, max_tokens=2**40), "max_tokens", "less than"),
    (CompletionRequest, _body(COMPLETION, stop_token_ids=[-1]), "stop_token_ids[0]", "greater"),
    (CompletionRequest, _body(COMPLETION, min_tokens=-1), "min_tokens", "greater than"),
    (CompletionRequest, _body(COMPLETION, min_p=1.5), "min_p", "less than"),
    (CompletionRequest, _body(COMPLETION, repetition_penalty=0), "repetition_penalty", "greater"),
    (CompletionRequest, _body(COMPLETION, ignore_eos="yes"), "ignore_eos", "boolean"),
    (CompletionRequest,
     _body(COMPLETION, stream=True, stream_options={"continuous_usage_stats": 1}),
     "stream_options.continuous_usage_stats", "boolean"),
    (CompletionRequest, b'{"model": "m", "prompt": "x", "temperature": NaN}', "temperature",
     "finite"),
    (CompletionRequest, b'{"model": "m", "prompt": "\xff"}', None, "not UTF-8"),
    (ChatCompletionRequest, _body(CHAT, messages=[5]), "messages[0]", "object"),
    (ChatCompletionRequest, _body(CHAT, messages=[]), "messages", "at least one"),
    (ChatCompletionRequest, _body(CHAT, messages="hi"), "messages", "valid array"),
    (ChatCompletionRequest, _body(CHAT, messages=[{"role": "robot", "content": "x"}]),
     "messages[0].role", "'user'"),
    (ChatCompletionRequest, _body(CHAT, messages=[{"role": "user"}]),
     "messages[0].content", "required"),
    (ChatCompletionRequest,
     _body(CHAT, messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
     "messages[0].content", "only 'text'"),
    (ChatCompletionRequest, _body(CHAT, top_logprobs=2), "top_logprobs", "logprobs: true"),
    (ChatCompletionRequest, _body(CHAT, tools=[{"type": "function"}]), "tools[0].function",
     "required"),
    (ChatCompletionRequest, _body(CHAT, tool_choice="required"), "tool_choice", "needs tools"),
    (ChatCompletionRequest, _body(CHAT, tools=[TOOL], tool_choice=_named("g")),
     "tool_choice.function.name", "not in tools"),
    (ChatCompletionRequest, _body(CHAT, tools=[TOOL], tool_choice="required",
                                  response_format={"type": "json_object"}),
     "tool_choice", "send one of them"),
    (ChatCompletionRequest, _body(CHAT, messages=[{"role": "tool", "content": "4"}]),
     "messages[0]", "tool_call_id"),
    (ChatCompletionRequest, _body(CHAT, messages=[{"role": "user", "content": None}]),
     "messages[0].content", "required"),
    (ChatCompletionRequest, _body(CHAT, messages=[{"role": "user", "content": "x",
                                                   "tool_calls": [CALL]}]),
     "messages[0]", "assistant message's"),
    (ChatCompletionRequest, _body(CHAT, messages=[{"role": "assistant", "content": None,
                                                   "tool_calls": [CALL | {"function": {
                                                       "name": "f", "arguments": "{x"}}]}]),
     "messages[0]", "tool_calls[0].function.arguments: not JSON"),
    (ChatCompletionRequest, _body(CHAT, response_format={"type": "json_schema"}),
     "response_format.json_schema", "required"),
    (ChatCompletionRequest, _body(CHAT, structured_outputs={"regex": "a", "choice": ["b"]}),
     "structured_outputs.choice", "only one kind"),
    (ChatCompletionRequest, _body(CHAT, add_generation_prompt=1), "add_generation_prompt",
     "boolean"),
]  # fmt: skip


@pytest.mark.parametrize(("cls", "body", "param", "words"), BAD)
def test_bad_request_names_its_field(
    cls: type[CompletionRequest] | type[ChatCompletionRequest],
    body: bytes,
    param: str | None,
    words: str,
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_request(cls, body)
    assert info.value.param == param
    assert words in str(info.value)


def test_vllm_extension_fields_are_read() -> None:
    req = parse_request(
        CompletionRequest,
        _body(
            COMPLETION,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            ignore_eos=True,
            min_tokens=0,
            repetition_penalty=1.0,
            stop_token_ids=[3, 4],
            skip_special_tokens=True,
            include_stop_str_in_output=False,
            spaces_between_special_tokens=False,
            top_k=5,
            min_p=0.0,
            seed=2**63 - 1,
        ),
    )
    assert req.continuous_usage and req.include_usage_chunk
    assert req.stop_token_ids == (3, 4) and req.seed == 2**63 - 1 and req.top_k == 5
    assert unknown_fields(req) == ()


def test_continuous_usage_needs_include_usage_as_in_vllm() -> None:
    opts = {"continuous_usage_stats": True}
    req = parse_request(CompletionRequest, _body(COMPLETION, stream=True, stream_options=opts))
    assert not req.continuous_usage


def test_unknown_fields_are_ignored_and_named_at_any_depth() -> None:
    body = _body(
        CHAT,
        frobnicate=1,
        stream=True,
        stream_options={"include_usage": True, "later": 2},
        messages=[{"role": "user", "content": "hi", "audio_id": "x"}],
        tools=[{"type": "function", "function": {"name": "f", "later": 1}}],
    )
    req = parse_request(ChatCompletionRequest, body)
    assert unknown_fields(req) == ("frobnicate", "stream_options.later", "messages[0].audio_id",
                                   "tools[0].function.later")  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_body(COMPLETION, frobnicate=1), "frobnicate"),
        (_body(COMPLETION, stream=True, stream_options={"later": 1}), "stream_options.later"),
    ],
)
def test_strict_fields_refuses_unknown_fields(body: bytes, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_request(CompletionRequest, body, strict_fields=True)
    assert info.value.param == param
    assert "unsupported field" in str(info.value)


def test_logit_bias_is_read_as_token_id_strings_with_float_biases() -> None:
    req = parse_request(CompletionRequest, _body(COMPLETION, logit_bias={"7": 100, "0": -100}))
    assert req.logit_bias == {"7": 100.0, "0": -100.0}
