"""The Responses streaming events of one output: one item open at a time, each closed with its
`.done` events when another kind begins, sequence numbers in order, and the last event's
response holding every item as the whole response would."""

from __future__ import annotations

import json

from loom_runtime.wire.openai.request import parse_request
from loom_runtime.wire.openai.responses.events import EventStream
from loom_runtime.wire.openai.responses.output import ResponseHead, Usage
from loom_runtime.wire.openai.responses.request import ResponsesRequest


def head() -> ResponseHead:
    req = parse_request(ResponsesRequest, json.dumps({"model": "m", "input": "x"}).encode())
    return ResponseHead("resp-1", "m", req, created_at=5)


def test_reasoning_then_text_then_two_calls_stream_as_four_items() -> None:
    s = EventStream(head())
    events = s.start()
    events += s.step({"reasoning": "hm", "reasoning_content": "hm"})
    events += s.step({"reasoning": "m", "content": "Hi"})
    events += s.step({"content": "!"})
    first = {"name": "f", "arguments": '{"a"'}
    events += s.step({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                      "function": first}]})  # fmt: skip
    events += s.step({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]})
    events += s.step({"tool_calls": [{"index": 1, "id": "c2", "type": "function",
                                      "function": {"name": "g", "arguments": "{}"}}]})  # fmt: skip
    events += s.finish("completed", Usage(3, 0, 7), None)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call",
                                                    "function_call"]  # fmt: skip
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "hmm"}]
    assert final["output"][1]["content"][0]["text"] == "Hi!"
    assert final["output"][2] | {"id": ""} == {"type": "function_call", "id": "", "call_id": "c1",
                                               "name": "f", "arguments": "{\"a\":1}",
                                               "status": "completed"}  # fmt: skip
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [
        0, 1, 2, 3]  # fmt: skip
    assert final["usage"]["total_tokens"] == 10 and final["status"] == "completed"


def test_an_empty_output_finishes_with_no_items_and_a_cut_one_is_incomplete() -> None:
    s = EventStream(head())
    events = [*s.start(), *s.finish("incomplete", Usage(), "max_output_tokens")]
    assert [e["type"] for e in events][-1] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-1]["response"]["output"] == []
