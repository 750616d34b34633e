"""A chat output read back as a message and as stream deltas: reasoning first, then calls out of
the content as the ToolPlan says; the finish reason vLLM gives; the deltas add up to the
message."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from loom_runtime.card.chat_parsers import ChatParsers
from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.chat.output import (
    DeltaStream,
    OutputPlan,
    finish_reason,
    output_plan,
    read_message,
)
from loom_runtime.wire.openai.tools import NamedToolChoice, ToolDef, tool_plan

TOOLS = [ToolDef.model_validate({"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})]  # fmt: skip
GLM = ChatParsers(tool_call_parser="glm47", reasoning_parser="glm45")
CALL = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"


def _ids() -> Any:
    counter = itertools.count()
    return lambda: f"call-{next(counter)}"


def _plan(choice: Any = None, parsers: ChatParsers = GLM, **kw: Any) -> OutputPlan:
    plan = tool_plan(TOOLS, choice, None)
    reasoning = parsers.reasoning_parser is not None
    return output_plan(plan, parsers.tool_call_parser, reasoning, plan.grammar is not None, **kw)


def _streamed(plan: OutputPlan, text: str, size: int) -> tuple[dict[str, Any], bool]:
    """The stream's deltas folded into one message, and whether a call was made."""
    stream = DeltaStream(plan, _ids())
    chunks = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    deltas = [stream.step(c, last=i == len(chunks) - 1) for i, c in enumerate(chunks)]
    msg: dict[str, Any] = {"content": None}
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        for key in ("content", "reasoning", "reasoning_content"):
            if key in d:
                msg[key] = (msg.get(key) or "") + d[key]
        for c in d.get("tool_calls", []):
            fresh = {"id": c.get("id"), "type": "function",
                     "function": {"name": None, "arguments": ""}}  # fmt: skip
            call = calls.setdefault(c["index"], fresh)
            call["function"]["name"] = c["function"].get("name") or call["function"]["name"]
            call["function"]["arguments"] += c["function"]["arguments"]
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg, stream.called


CASES = [
    ("weighing</think>" + CALL, None,
     {"content": None, "reasoning": "weighing", "reasoning_content": "weighing",
      "tool_calls": [{"id": "call-0", "type": "function", "function": {
          "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}),
    ("hmm</think>It is sunny.", None,
     {"content": "It is sunny.", "reasoning": "hmm", "reasoning_content": "hmm"}),
    ("hmm</think>" + CALL, "none",
     {"content": CALL, "reasoning": "hmm", "reasoning_content": "hmm"}),
]  # fmt: skip


@pytest.mark.parametrize("size", [1, 6, 10_000])
@pytest.mark.parametrize(("text", "choice", "message"), CASES)
def test_a_glm_output_reads_as_reasoning_and_calls_whole_and_streamed(
    text: str, choice: Any, message: dict[str, Any], size: int
) -> None:
    plan = _plan(choice)
    whole = read_message(plan, text, _ids())
    assert whole.fields(plan) == message
    streamed, called = _streamed(plan, text, size)
    assert {k: v for k, v in streamed.items() if v is not None or k == "content"} == {
        k: v for k, v in message.items() if v is not None or k == "content"
    }
    assert called == ("tool_calls" in message)


def test_a_forced_call_has_no_reasoning_read_and_its_json_is_the_call() -> None:
    named = NamedToolChoice.model_validate({"type": "function",
                                            "function": {"name": "get_weather"}})  # fmt: skip
    plan = _plan(named)
    assert not plan.reasoning  # the grammar held the output from its first token
    fields = read_message(plan, '{"city":"Oslo"}', _ids()).fields(plan)
    assert fields["tool_calls"][0]["function"] == {"name": "get_weather",
                                                   "arguments": '{"city":"Oslo"}'}  # fmt: skip
    required = _plan("required")
    text = '[{"name":"get_weather","parameters":{"city":"Oslo"}}]'
    calls = read_message(required, text, _ids()).tool_calls
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert _streamed(required, text, 5)[0]["tool_calls"] == list(calls)


def test_include_reasoning_false_drops_the_reasoning() -> None:
    plan = _plan(include_reasoning=False)
    assert read_message(plan, "hmm</think>ok", _ids()).fields(plan) == {"content": "ok"}
    assert _streamed(plan, "hmm</think>ok", 3)[0] == {"content": "ok"}


@pytest.mark.parametrize(
    ("choice", "called", "reason", "expected"),
    [("auto", True, "stop", "tool_calls"), ("auto", True, "length", "tool_calls"),
     ("auto", False, "stop", "stop"), ("required", True, "stop", "tool_calls"),
     ("required", True, "length", "length"), ("none", False, "stop", "stop")],
)  # fmt: skip
def test_the_finish_reason_is_tool_calls_as_vllm_gives_it(
    choice: str, called: bool, reason: str, expected: str
) -> None:
    assert finish_reason(_plan(choice), called, reason) == expected


def test_a_named_call_finishes_as_the_output_did() -> None:
    named = NamedToolChoice.model_validate({"type": "function",
                                            "function": {"name": "get_weather"}})  # fmt: skip
    assert finish_reason(_plan(named), True, "stop") == "stop"


def test_auto_without_a_tool_call_parser_is_a_400_naming_tool_choice() -> None:
    with pytest.raises(InvalidRequestError) as err:
        _plan("auto", ChatParsers())
    assert err.value.param == "tool_choice" and "toolCallParser" in str(err.value)
    assert _plan("none", ChatParsers()).plain
