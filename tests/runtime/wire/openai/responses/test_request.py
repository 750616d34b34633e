"""A Responses request as the chat request it runs as: items to messages (calls joined to the
assistant's turn, outputs as tool messages, reasoning not rendered), tools, tool_choice and
text.format in chat's shapes, and chat's error params named as the Responses request names them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.request import parse_request
from loom_runtime.wire.openai.responses.request import (
    ResponsesRequest,
    chat_body,
    conversation,
    responses_param,
)


def parse(**body: Any) -> ResponsesRequest:
    return parse_request(ResponsesRequest, json.dumps({"model": "m", **body}).encode())


def test_items_become_chat_messages_with_calls_joined_to_the_assistants_turn() -> None:
    req = parse(input=[
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ], instructions="be nice")  # fmt: skip
    turns = conversation(req, [{"role": "user", "content": "before"}])
    assert turns == [
        {"role": "user", "content": "before"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]  # fmt: skip
    body = chat_body(req, turns)
    assert body["messages"][0] == {"role": "system", "content": "be nice"}
    assert body["messages"][1:] == turns


def test_tools_choice_format_and_sampling_fields_take_chats_shapes() -> None:
    req = parse(
        input="x", tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "f"}, max_output_tokens=5, top_k=3,
        text={"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"},
                         "strict": True}},
    )  # fmt: skip
    body = chat_body(req, conversation(req, []))
    function = {"name": "f", "parameters": {"type": "object"}}
    assert body["tools"] == [{"type": "function", "function": function}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["max_completion_tokens"] == 5 and body["top_k"] == 3
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "s", "schema": {"type": "object"}, "strict": True}}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "s"}}}, "text.format"),
        ({"input": [{"type": "computer_call", "id": "x"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input"),
    ],
)
def test_what_a_chat_request_cannot_say_is_a_400_naming_it(
    body: dict[str, Any], param: str
) -> None:
    req = parse(**({"input": "x"} | body))
    with pytest.raises(InvalidRequestError) as err:
        chat_body(req, conversation(req, []))
    assert err.value.param == param


def test_chat_params_are_named_as_the_responses_request_names_them() -> None:
    assert responses_param("max_completion_tokens") == "max_output_tokens"
    assert responses_param("messages[2].content") == "input"
    assert responses_param("response_format") == "text.format"
    assert responses_param("top_k") == "top_k" and responses_param(None) is None
