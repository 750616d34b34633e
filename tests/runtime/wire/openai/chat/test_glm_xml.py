"""The GLM-4.5+ XML-like tool-call format: well-formed calls (name on its own line or not, no
arguments, values typed by the schema), and malformed output read as plain content."""

from __future__ import annotations

import json

import pytest

from loom_runtime.wire.openai.chat.calls import FunctionCall, PartialCall
from loom_runtime.wire.openai.chat.glm_xml import GlmXml
from loom_runtime.wire.openai.chat.tool_stream import Extracted, extract

WEATHER = {"get_weather": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"},
    "units": {"type": ["string", "null"]}}}}  # fmt: skip
GLM45 = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")  # fmt: skip


def _args(**kw: object) -> str:
    return json.dumps(kw, ensure_ascii=False)


CASES = [
    (GLM45, Extracted(None, (FunctionCall("get_weather", _args(city="Paris", days=3)),))),
    ("I will look.\n" + GLM45,
     Extracted("I will look.\n", (FunctionCall("get_weather", _args(city="Paris", days=3)),))),
    # GLM-4.7: the name on the tag's line, and a call without arguments
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"
     "<tool_call>now</tool_call>",
     Extracted(None, (FunctionCall("get_weather", _args(city="Oslo")), FunctionCall("now", "{}")))),
    # a string-typed value stays a string even when it reads as JSON; others are JSON or text
    ("<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>42</arg_value>"
     "<arg_key>units</arg_key><arg_value>null</arg_value>"
     "<arg_key>extra</arg_key><arg_value>{\"a\": [1]}</arg_value></tool_call>",
     Extracted(None, (FunctionCall("get_weather", _args(city="42", units="null",
                                                        extra={"a": [1]})),))),
    ("<tool_call>lookup\n<arg_key>q</arg_key><arg_value>not json</arg_value></tool_call>",
     Extracted(None, (FunctionCall("lookup", _args(q="not json")),))),
    # malformed: plain content, never an error
    ("no calls at all", Extracted("no calls at all")),
    ("<tool_call>get_weather\n<arg_key>city</arg_key>", Extracted(
        "<tool_call>get_weather\n<arg_key>city</arg_key>")),
    ("<tool_call></tool_call>", Extracted("<tool_call></tool_call>")),
    ("<tool_call>f\n<arg_key>a</arg_key>junk</tool_call>",
     Extracted("<tool_call>f\n<arg_key>a</arg_key>junk</tool_call>")),
    # text after the last call is dropped, as vLLM's reader does
    (GLM45 + " trailing words",
     Extracted(None, (FunctionCall("get_weather", _args(city="Paris", days=3)),))),
    ("<tool_call><b>x</b></tool_call>", Extracted("<tool_call><b>x</b></tool_call>")),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_glm_output_reads_as_calls_or_content(text: str, expected: Extracted) -> None:
    assert extract(GlmXml(), text, WEATHER) == expected


def test_an_open_call_has_its_name_and_the_settled_arguments_only() -> None:
    fmt = GlmXml()
    assert fmt.partial("<tool_call>get_wea", WEATHER) == []
    assert fmt.partial("<tool_call>get_weather\n<arg_key>ci", WEATHER) == [
        PartialCall("get_weather")
    ]
    opened = fmt.partial(GLM45.removesuffix("\n</tool_call>"), WEATHER)
    assert opened == [PartialCall("get_weather", '{"city": "Paris", "days": 3')]
    closed = fmt.partial(GLM45, WEATHER)
    assert closed == [PartialCall("get_weather", _args(city="Paris", days=3), done=True)]
    assert closed[0].arguments.startswith(opened[0].arguments)


def test_a_partial_start_tag_is_held_back_and_nothing_else() -> None:
    fmt = GlmXml()
    assert fmt.held_back("Sure <tool_") == len("<tool_")
    assert fmt.held_back("Sure <b>") == 0
    assert fmt.region_start("a<tool_call>") == 1
