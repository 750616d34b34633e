"""Forced calls (tool_choice required or a named function): the grammar's JSON read as calls,
whole or streamed; an output that is not such JSON is content, never an error."""

from __future__ import annotations

import itertools

import pytest

from loom_runtime.wire.openai.chat.calls import CallDelta, FunctionCall
from loom_runtime.wire.openai.chat.forced import (
    NamedCallStream,
    RequiredCallStream,
    extract_named,
    extract_required,
)
from loom_runtime.wire.openai.chat.tool_stream import Extracted, Pieces

REQUIRED = [
    ('[{"name":"a","parameters":{"x":1}}]', Extracted(None, (FunctionCall("a", '{"x": 1}'),))),
    ('[{"name":"a","parameters":{}},{"name":"b","parameters":{"y":"z"}}]',
     Extracted(None, (FunctionCall("a", "{}"), FunctionCall("b", '{"y": "z"}')))),
    # cut short (max_tokens): its complete items are calls, as the stream sent them
    ('[{"name":"a","parameters":{"x":1}}', Extracted(None, (FunctionCall("a", '{"x": 1}'),))),
    ('[{"name":"a","parameters":{"x":', Extracted('[{"name":"a","parameters":{"x":')),
    ("[]", Extracted("[]")),
    ('{"name":"a","parameters":{}}', Extracted('{"name":"a","parameters":{}}')),
    ('[{"name":"a"}]', Extracted('[{"name":"a"}]')),
    ("", Extracted("")),
]  # fmt: skip


def _ids() -> itertools.count[int]:
    return itertools.count()


@pytest.mark.parametrize(("text", "expected"), REQUIRED)
def test_required_output_reads_as_calls_or_content(text: str, expected: Extracted) -> None:
    assert extract_required(text) == expected


@pytest.mark.parametrize("size", [1, 4, 1000])
@pytest.mark.parametrize(("text", "expected"), REQUIRED)
def test_required_stream_sends_each_call_whole_once_its_item_closes(
    text: str, expected: Extracted, size: int
) -> None:
    counter = _ids()
    stream = RequiredCallStream(lambda: f"id{next(counter)}")
    pieces = [stream.feed(text[i : i + size]) for i in range(0, len(text), size)]
    pieces.append(stream.finish())
    deltas = [d for p in pieces for d in p.calls]
    assert [FunctionCall(d.name or "", d.arguments) for d in deltas] == list(expected.calls)
    assert [d.id for d in deltas] == [f"id{i}" for i in range(len(deltas))]
    assert "".join(p.content for p in pieces) == (expected.content or "")
    assert stream.called == bool(expected.calls)


def test_required_stream_keeps_max_calls() -> None:
    stream = RequiredCallStream(lambda: "id", max_calls=1)
    text = '[{"name":"a","parameters":{}},{"name":"b","parameters":{}}]'
    assert [d.name for d in stream.feed(text).calls] == ["a"]


def test_a_named_call_is_the_whole_output_as_its_arguments() -> None:
    assert extract_named("f", '{"x": 1}') == Extracted(None, (FunctionCall("f", '{"x": 1}'),))
    stream = NamedCallStream("f", lambda: "id0")
    assert stream.feed('{"x"') == Pieces("", (CallDelta(0, '{"x"', "id0", "f"),))
    assert stream.feed(": 1}") == Pieces("", (CallDelta(0, ": 1}"),))
    assert stream.finish() == Pieces()


def test_a_named_call_with_no_output_is_still_announced() -> None:
    stream = NamedCallStream("f", lambda: "id0")
    assert stream.finish() == Pieces("", (CallDelta(0, "", "id0", "f"),))
