"""Tool calling with the real `openai` SDK against `loom up examples/tiny-pd.yaml` (router, one
prefill, one decode; every request prefilled remotely): a named function or `required` returns a
parseable call of the given functions for every seed, `auto` reads the model's llama-3 JSON call
(a regex holds the random model to one), and streams carry OpenAI's tool_calls deltas through the
router (id and name first, then arguments fragments)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import OpenAI

from loom_operator.testing.fleet import FleetProcess

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "additionalProperties": False,
        "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}}},
]  # fmt: skip
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES: Any = [{"role": "user", "content": "What is the weather in Oslo right now? " * 3}]
LLAMA_CALL = r'\{"name": "get_time", "parameters": \{"zone": "(utc|cet)"\}\}'

EXAMPLE = "tiny-pd"


@pytest.fixture(scope="module")
def client(tiny_example: FleetProcess) -> OpenAI:
    return OpenAI(base_url=tiny_example.endpoint, api_key="unused", max_retries=0, timeout=120)


def _valid(name: str, arguments: str) -> bool:
    args = json.loads(arguments)
    if name == "get_weather":
        return set(args) == {"city", "unit"} and len(args["city"]) <= 8 and args["unit"] in "cf"
    return name == "get_time" and args == {"zone": args["zone"]} and args["zone"] in ("utc", "cet")


def test_a_named_function_returns_a_parseable_call_for_every_seed(client: OpenAI) -> None:
    for seed in range(4):
        done = client.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED, temperature=1.0,
            seed=seed, max_tokens=96,
        )  # fmt: skip
        (call,) = done.choices[0].message.tool_calls or []
        assert call.function.name == "get_weather" and call.id
        assert _valid(call.function.name, call.function.arguments), call.function.arguments


def test_required_returns_calls_of_the_given_functions_for_every_seed(client: OpenAI) -> None:
    for seed in range(3):
        done = client.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
            temperature=1.0, seed=seed, max_tokens=200,
        )  # fmt: skip
        choice = done.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        for call in choice.message.tool_calls:
            assert _valid(call.function.name, call.function.arguments), call.function.arguments


def test_auto_reads_the_models_own_call(client: OpenAI) -> None:
    done = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="auto", temperature=0,
        max_tokens=48, extra_body={"structured_outputs": {"regex": LLAMA_CALL}},
    )  # fmt: skip
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert _valid(call.function.name, call.function.arguments)


@pytest.mark.parametrize(
    "ask", [{"tool_choice": NAMED}, {"tool_choice": "required"},
            {"tool_choice": "auto", "extra_body": {"structured_outputs": {"regex": LLAMA_CALL}}}],
)  # fmt: skip
def test_streamed_calls_arrive_as_tool_calls_deltas_through_the_router(
    client: OpenAI, ask: dict[str, Any]
) -> None:
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=160, stream=True,
        **ask,
    )  # fmt: skip
    calls: dict[int, dict[str, str]] = {}
    for event in stream:
        for d in event.choices[0].delta.tool_calls or [] if event.choices else []:
            if d.id is not None:
                assert d.index not in calls and d.type == "function" and d.function.name
                calls[d.index] = {"name": d.function.name, "args": ""}
            calls[d.index]["args"] += d.function.arguments or ""
    assert calls
    for call in calls.values():
        assert _valid(call["name"], call["args"]), call
