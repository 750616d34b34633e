"""Streamed tool calls: however the output is cut into deltas, the content sent plus each call's
id, name (once, first) and arguments fragments add up to what the whole output reads as."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pytest

from loom_runtime.wire.openai.chat.calls import CallDelta, FunctionCall
from loom_runtime.wire.openai.chat.formats import ToolFormat
from loom_runtime.wire.openai.chat.glm_xml import GlmXml
from loom_runtime.wire.openai.chat.llama3_json import Llama3Json
from loom_runtime.wire.openai.chat.tool_stream import Pieces, ToolCallStream, extract

from .test_glm_xml import CASES as GLM_CASES
from .test_glm_xml import WEATHER
from .test_llama3_json import CASES as LLAMA_CASES

FORMATS: list[tuple[ToolFormat, str]] = [(GlmXml(), text) for text, _ in GLM_CASES] + [
    (Llama3Json(), text) for text, _ in LLAMA_CASES
]


def _ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call-{next(counter)}"


def _run(fmt: ToolFormat, text: str, size: int, max_calls: int | None = None) -> list[Pieces]:
    stream = ToolCallStream(fmt, WEATHER, _ids(), max_calls)
    pieces = [stream.feed(text[i : i + size]) for i in range(0, len(text), size)]
    return [*pieces, stream.finish()]


def _calls(deltas: list[CallDelta]) -> list[FunctionCall]:
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for d in deltas:
        if d.id is not None:
            assert d.index not in names, "a call's id and name are sent once"
            assert d.index == len(names), "calls start in index order"
            assert d.name is not None
            names[d.index] = d.name
        assert d.index in names, "a call's arguments come after its name"
        args[d.index] = args.get(d.index, "") + d.arguments
    return [FunctionCall(names[i], args[i]) for i in sorted(names)]


ANNOUNCED_THEN_MALFORMED = {
    "<tool_call>get_weather\n<arg_key>city</arg_key>",
    "<tool_call>f\n<arg_key>a</arg_key>junk</tool_call>",
}
"""Outputs whose call was announced (id and name sent) before they turned malformed."""


@pytest.mark.parametrize("size", [1, 3, 7, 10_000])
@pytest.mark.parametrize(("fmt", "text"), FORMATS)
def test_streamed_calls_add_up_to_the_whole_outputs(fmt: ToolFormat, text: str, size: int) -> None:
    whole = extract(fmt, text, WEATHER)
    pieces = _run(fmt, text, size)
    content = "".join(p.content for p in pieces)
    calls = _calls([d for p in pieces for d in p.calls])
    if text in ANNOUNCED_THEN_MALFORMED and calls:
        assert content == "" and [c.name for c in calls] in (["get_weather"], ["f"])
        assert all(json.loads(c.arguments) is not None for c in calls)  # closed, parseable
        return
    assert content == (whole.content or "")
    assert calls == list(whole.calls)


def test_a_call_is_announced_before_its_arguments_arrive() -> None:
    text = (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>"
    )
    stream = ToolCallStream(GlmXml(), WEATHER, _ids())
    first = stream.feed(text[: text.index("<arg_key>") + 3])
    assert first.calls == (CallDelta(0, "", "call-0", "get_weather"),)
    middle = stream.feed(text[len(text[: text.index("<arg_key>") + 3]) : -len("</tool_call>")])
    assert middle.calls == (CallDelta(0, '{"city": "Rome"'),)
    assert stream.feed("</tool_call>").calls == (CallDelta(0, "}"),)
    assert stream.finish() == Pieces()
    assert stream.called


def test_parallel_tool_calls_false_sends_the_first_call_only() -> None:
    text = '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}'
    pieces = _run(Llama3Json(), text, 4, max_calls=1)
    assert _calls([d for p in pieces for d in p.calls]) == [FunctionCall("a", "{}")]
    assert extract(Llama3Json(), text, {}, max_calls=1).calls == (FunctionCall("a", "{}"),)


def test_text_that_only_looked_like_a_call_is_sent_as_content_at_the_end() -> None:
    stream = ToolCallStream(Llama3Json(), {}, _ids())
    assert stream.feed('{"answer": ') == Pieces()
    assert stream.feed("42}") == Pieces()
    assert stream.finish() == Pieces('{"answer": 42}')
    assert not stream.called
