"""Tool calling and reasoning on a live worker of the tiny model, through the official openai
client: a named function or `required` returns a call whose arguments parse against the schema
(the grammar holds the random model to it), `auto` reads the model's own llama-3 JSON call (held
to one by a regex here), streamed as OpenAI's tool_calls deltas; a reasoning parser moves the
thinking into `reasoning`; history with calls and tool results renders."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
     "parameters": {"type": "object", "additionalProperties": False,
                    "properties": {"city": {"type": "string", "maxLength": 8},
                                   "unit": {"enum": ["c", "f"]}},
                    "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}}},
]  # fmt: skip
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
LLAMA_CALL = r'\{"name": "get_time", "parameters": \{"zone": "(utc|cet)"\}\}'


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


def _check_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")
    assert isinstance(args["city"], str) and len(args["city"]) <= 8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_named_function_returns_a_parseable_call_every_time(
    client: openai.OpenAI, worker: Any, seed: int
) -> None:
    done = client.chat.completions.create(
        model=worker.model, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=96,
        temperature=1.0, seed=seed,
    )  # fmt: skip
    choice = done.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    _check_weather(call.function.arguments)


@pytest.mark.parametrize("seed", [0, 1])
def test_required_returns_calls_of_the_given_functions(
    client: openai.OpenAI, worker: Any, seed: int
) -> None:
    done = client.chat.completions.create(
        model=worker.model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=160,
        temperature=1.0, seed=seed, parallel_tool_calls=False,
    )  # fmt: skip
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        _check_weather(call.function.arguments)
    else:
        assert args["zone"] in ("utc", "cet")


def _streamed(stream: Any) -> tuple[list[Any], dict[int, dict[str, Any]], str | None]:
    deltas, calls, reason = [], {}, None
    for event in stream:
        choice = event.choices[0]
        reason = choice.finish_reason or reason
        for d in choice.delta.tool_calls or []:
            deltas.append(d)
            call = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "args": ""})
            call["args"] += d.function.arguments or ""
    return deltas, calls, reason


def test_a_streamed_named_call_sends_id_and_name_first_then_arguments(
    client: openai.OpenAI, worker: Any
) -> None:
    stream = client.chat.completions.create(
        model=worker.model, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=96,
        temperature=0, stream=True,
    )  # fmt: skip
    deltas, calls, reason = _streamed(stream)
    assert deltas[0].id and deltas[0].type == "function" and deltas[0].function.name
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    assert reason == "stop" and calls[0]["name"] == "get_weather"
    _check_weather(calls[0]["args"])
    whole = client.chat.completions.create(
        model=worker.model, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=96,
        temperature=0,
    )  # fmt: skip
    assert (whole.choices[0].message.tool_calls or [])[0].function.arguments == calls[0]["args"]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_reads_the_models_llama3_json_call(
    client: openai.OpenAI, worker: Any, stream: bool
) -> None:
    """The tiny model's family reads calls as llama3_json; a regex makes its output one."""
    kw: Any = dict(model=worker.model, messages=ASK, tools=TOOLS, tool_choice="auto",
                   max_tokens=48, temperature=0, extra_body={"structured_outputs": {
                       "regex": LLAMA_CALL}})  # fmt: skip
    if stream:
        _, calls, reason = _streamed(client.chat.completions.create(stream=True, **kw))
        name, args = calls[0]["name"], calls[0]["args"]
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        reason = choice.finish_reason
        assert choice.message.content is None
        (call,) = choice.message.tool_calls or []
        name, args = call.function.name, call.function.arguments
    assert reason == "tool_calls" and name == "get_time"
    assert json.loads(args)["zone"] in ("utc", "cet")


def test_auto_output_that_is_no_call_is_plain_content(client: openai.OpenAI, worker: Any) -> None:
    done = client.chat.completions.create(
        model=worker.model, messages=ASK, tools=TOOLS, max_tokens=12, temperature=0,
    )  # fmt: skip
    choice = done.choices[0]
    plain = client.chat.completions.create(
        model=worker.model, messages=ASK, max_tokens=12, temperature=0
    ).choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    assert choice.message.content == plain.message.content  # the tiny template ignores tools


def test_history_with_calls_and_tool_results_renders(client: openai.OpenAI, worker: Any) -> None:
    messages: Any = [*ASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call-1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call-1", "content": "Sunny, 21 C"}]  # fmt: skip
    done = client.chat.completions.create(model=worker.model, messages=messages, max_tokens=4)
    assert done.choices[0].message.content is not None


def test_unhonourable_tool_fields_are_400s_naming_them(client: openai.OpenAI, worker: Any) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ]  # fmt: skip
    for extra, param in bad:
        request = {"model": worker.model, "messages": ASK, **extra}
        status, body, _ = worker.post("/v1/chat/completions", request)
        assert status == 400 and body["error"]["param"] == param, (extra, body)


def test_a_reasoning_parser_moves_the_thinking_into_reasoning(launch: Any, tiny_v1: Any) -> None:
    """deepseek_r1: the template opened <think>, so the random output (no </think>) is all
    reasoning, and it is exactly the text the same greedy request gets without the parser."""
    with launch(tiny_v1, "--reasoning-parser", "deepseek_r1") as w:
        body = {"model": w.model, "messages": ASK, "max_tokens": 8, "temperature": 0}
        status, done, _ = w.post("/v1/chat/completions", body)
        assert status == 200, done
        message = done["choices"][0]["message"]
        assert message["reasoning"] == message["reasoning_content"] and message["reasoning"]
        assert not message["content"]
        status, dropped, _ = w.post("/v1/chat/completions", body | {"include_reasoning": False})
        assert "reasoning" not in dropped["choices"][0]["message"]
    with launch(tiny_v1) as plain:
        _, same, _ = plain.post("/v1/chat/completions", body | {"model": plain.model})
        assert same["choices"][0]["message"]["content"] == message["reasoning"]
