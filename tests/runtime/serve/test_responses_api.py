"""POST /v1/responses on a live worker of the tiny model, through the official openai client:
a response equals the chat completion of the same messages (greedy), streams as the Responses
events in order, continues a stored response by previous_response_id, calls a function held to
its schema, keeps to a JSON schema, and refuses what it does not honour."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

WEATHER: Any = {
    "type": "function", "name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "additionalProperties": False,
                   "properties": {"city": {"type": "string", "maxLength": 8},
                                  "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"]},
}  # fmt: skip
GREEDY: dict[str, Any] = {"temperature": 0.0}


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


def chat_text(client: openai.OpenAI, model: str, messages: list[Any], max_tokens: int) -> str:
    done = client.chat.completions.create(
        model=model, messages=messages, max_completion_tokens=max_tokens, temperature=0.0
    )
    return done.choices[0].message.content or ""


def test_a_response_is_the_chat_completion_of_its_instructions_and_input(
    client: openai.OpenAI, worker: Any
) -> None:
    resp = client.responses.create(
        model=worker.model, instructions="Be brief.", input="Name a colour.",
        max_output_tokens=12, **GREEDY,
    )  # fmt: skip
    asked = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": "Name a colour."}]  # fmt: skip
    want = chat_text(client, worker.model, asked, 12)
    assert resp.output_text == want
    assert resp.id.startswith("resp") and resp.object == "response" and resp.model == worker.model
    (item,) = resp.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert resp.status == "incomplete"  # the tiny model does not stop within 12 tokens
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage is not None and resp.usage.output_tokens == 12
    assert resp.usage.total_tokens == resp.usage.input_tokens + 12
    assert client.responses.retrieve(resp.id).output_text == want


def test_a_streamed_response_sends_the_events_in_order_and_the_same_text(
    client: openai.OpenAI, worker: Any
) -> None:
    args: dict[str, Any] = dict(model=worker.model, input="Count to five.", max_output_tokens=10,
                                **GREEDY)  # fmt: skip
    whole = client.responses.create(**args)
    events = list(client.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]  # fmt: skip
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    last = events[-1].response  # type: ignore[union-attr]
    assert last.output_text == whole.output_text and last.usage == whole.usage


def test_previous_response_id_continues_the_stored_conversation(
    client: openai.OpenAI, worker: Any
) -> None:
    first = client.responses.create(model=worker.model, input="Hello there.",
                                    max_output_tokens=6, **GREEDY)  # fmt: skip
    second = client.responses.create(
        model=worker.model, input="And then?", previous_response_id=first.id,
        max_output_tokens=6, **GREEDY,
    )  # fmt: skip
    history = [{"role": "user", "content": "Hello there."},
               {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "And then?"}]  # fmt: skip
    assert second.output_text == chat_text(client, worker.model, history, 6)
    assert second.previous_response_id == first.id
    unkept = client.responses.create(model=worker.model, input="x", store=False,
                                     max_output_tokens=2)  # fmt: skip
    for missing in (unkept.id, "resp-nope"):
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(model=worker.model, input="y", previous_response_id=missing)
        assert "no stored response" in str(err.value)


def test_a_named_function_returns_a_call_and_its_output_continues_the_response(
    client: openai.OpenAI, worker: Any
) -> None:
    resp = client.responses.create(
        model=worker.model, input="Weather in Oslo?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=96,
        temperature=1.0,
    )  # fmt: skip
    (call,) = [i for i in resp.output if i.type == "function_call"]
    args = json.loads(call.arguments)  # type: ignore[union-attr]
    assert set(args) == {"city", "unit"} and call.name == "get_weather"  # type: ignore[union-attr]
    after = client.responses.create(
        model=worker.model, previous_response_id=resp.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id,  # type: ignore[union-attr]
                "output": '{"temp": 3}'}],
        max_output_tokens=6, **GREEDY,
    )  # fmt: skip
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": call.call_id, "type": "function",  # type: ignore[union-attr]
                    "function": {"name": "get_weather", "arguments": call.arguments}}]},  # type: ignore[union-attr]
               {"role": "tool", "tool_call_id": call.call_id, "content": '{"temp": 3}'}]  # type: ignore[union-attr]  # fmt: skip
    tools: Any = [{"type": "function", "function": {k: v for k, v in WEATHER.items()
                                                    if k != "type"}}]  # fmt: skip
    want = client.chat.completions.create(model=worker.model, messages=history, tools=tools,
                                          max_completion_tokens=6, temperature=0.0)  # fmt: skip
    assert after.output_text == (want.choices[0].message.content or "")


def test_a_streamed_function_call_sends_its_arguments_as_deltas(
    client: openai.OpenAI, worker: Any
) -> None:
    events = list(client.responses.create(
        model=worker.model, input="Weather?", tools=[WEATHER], tool_choice="required",
        max_output_tokens=96, temperature=1.0, extra_body={"seed": 4}, stream=True,
    ))  # fmt: skip
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == done.arguments and set(json.loads(done.arguments)) == {"city", "unit"}
    final = events[-1].response  # type: ignore[union-attr]
    assert [i.type for i in final.output] == ["function_call"]


def test_text_format_json_schema_holds_the_output_to_the_schema(
    client: openai.OpenAI, worker: Any
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}  # fmt: skip
    resp = client.responses.create(
        model=worker.model, input="A number?", max_output_tokens=40, temperature=1.0,
        extra_body={"seed": 2},
        text={"format": {"type": "json_schema", "name": "num", "schema": schema}},
    )  # fmt: skip
    assert isinstance(json.loads(resp.output_text)["n"], int)


@pytest.mark.parametrize(
    ("more", "param"),
    [({"background": True}, "background"), ({"include": ["reasoning.encrypted_content"]},
     "include"), ({"max_output_tokens": 0}, "max_output_tokens"),
     ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image"}]}]},
      "input")],
)  # fmt: skip
def test_what_is_not_honoured_is_a_400_naming_it(
    worker: Any, more: dict[str, Any], param: str
) -> None:
    status, body, _ = worker.post("/v1/responses", {"model": worker.model, "input": "x", **more})
    assert status == 400 and body["error"]["param"] == param, body
