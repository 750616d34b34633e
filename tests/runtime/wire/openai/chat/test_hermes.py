"""The Hermes tool-call format: JSON calls between `<tool_call>` tags after any content, the
last one possibly left open at the end; anything else is plain content."""

from __future__ import annotations

import pytest

from loom_runtime.wire.openai.chat.calls import FunctionCall, PartialCall
from loom_runtime.wire.openai.chat.hermes import Hermes
from loom_runtime.wire.openai.chat.tool_stream import Extracted, extract

ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
CASES = [
    (ONE, Extracted(None, (FunctionCall("get_weather", '{"city": "Oslo"}'),))),
    ("Let me check.\n" + ONE, Extracted("Let me check.\n",
                                        (FunctionCall("get_weather", '{"city": "Oslo"}'),))),
    (ONE + "\n" + '<tool_call>{"name": "f", "parameters": {}}</tool_call>',
     Extracted(None, (FunctionCall("get_weather", '{"city": "Oslo"}'), FunctionCall("f", "{}")))),
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}',  # left open; arguments as a string
     Extracted(None, (FunctionCall("f", '{"x": 1}'),))),
    # malformed or not a call: plain content
    ("No tools needed.", Extracted("No tools needed.")),
    ('<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>',
     Extracted('<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>')),
    ('<tool_call>{"arguments": {}}</tool_call>',
     Extracted('<tool_call>{"arguments": {}}</tool_call>')),
    ("<tool_call>", Extracted("<tool_call>")),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_hermes_output_reads_as_calls_or_content(text: str, expected: Extracted) -> None:
    assert extract(Hermes(), text, {}) == expected


def test_a_call_is_settled_when_it_closes_and_a_partial_tag_is_held_back() -> None:
    fmt = Hermes()
    assert fmt.partial('<tool_call>{"name": "a", "arguments": {"x"', {}) == []
    assert fmt.partial('<tool_call>{"name": "a", "arguments": {}}</tool_call>', {}) == [
        PartialCall("a", "{}", done=True)
    ]
    assert fmt.held_back("Sure <tool_") == len("<tool_")
    assert fmt.held_back("Sure") == 0 and fmt.region_start("Sure") is None
