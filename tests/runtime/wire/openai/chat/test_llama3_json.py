"""The llama-3 JSON tool-call format: objects from the output's start or after the python tag,
`parameters` or `arguments`, several separated by `;`; anything else is plain content."""

from __future__ import annotations

import pytest

from loom_runtime.wire.openai.chat.calls import FunctionCall, PartialCall
from loom_runtime.wire.openai.chat.llama3_json import Llama3Json
from loom_runtime.wire.openai.chat.tool_stream import Extracted, extract

CASES = [
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}',
     Extracted(None, (FunctionCall("get_weather", '{"city": "Paris"}'),))),
    ('\n {"name": "f", "arguments": {"x": [1, 2]}}',
     Extracted(None, (FunctionCall("f", '{"x": [1, 2]}'),))),
    ('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": "é"}}',
     Extracted(None, (FunctionCall("a", "{}"), FunctionCall("b", '{"k": "é"}')))),
    ('Let me see. <|python_tag|>{"name": "a", "parameters": {}}',
     Extracted("Let me see. ", (FunctionCall("a", "{}"),))),
    # malformed or not a call: plain content
    ("The answer is 4.", Extracted("The answer is 4.")),
    ('I think {"name": "a", "parameters": {}}',
     Extracted('I think {"name": "a", "parameters": {}}')),
    ('{"name": "a", "parameters": {"x": 1}', Extracted('{"name": "a", "parameters": {"x": 1}')),
    ('{"name": "a"}', Extracted('{"name": "a"}')),
    ('{"name": "", "parameters": {}}', Extracted('{"name": "", "parameters": {}}')),
    ('{"name": "a", "parameters": "x=1"}', Extracted('{"name": "a", "parameters": "x=1"}')),
    ('{"city": "Paris"}', Extracted('{"city": "Paris"}')),
    ('{"name": "a", "parameters": {}} and more',
     Extracted('{"name": "a", "parameters": {}} and more')),
    ("[1, 2]", Extracted("[1, 2]")),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_llama3_output_reads_as_calls_or_content(text: str, expected: Extracted) -> None:
    assert extract(Llama3Json(), text, {}) == expected


def test_a_call_is_sent_once_a_separator_follows_it_so_junk_after_it_is_still_content() -> None:
    fmt = Llama3Json()
    one = '{"name": "a", "parameters": {"x": 1}}'
    assert fmt.partial('{"name": "a", "parameters": {"ci', {}) == []
    assert fmt.partial(one, {}) == []
    assert fmt.partial(one + "; {", {}) == [PartialCall("a", '{"x": 1}', done=True)]
    assert fmt.partial(one + " and", {}) == []


def test_leading_whitespace_and_a_partial_tag_are_held_back() -> None:
    fmt = Llama3Json()
    assert fmt.held_back("  \n") == 3
    assert fmt.held_back("Sure <|python") == len("<|python")
    assert fmt.held_back("Sure.") == 0
