"""Property: for any well-formed tool calls a model writes (GLM's XML-like or llama-3's JSON,
with content before them) and any cutting of the output into deltas, the streamed content and
call deltas add up to exactly what the whole output reads as, and every call's arguments parse."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from loom_runtime.wire.openai.chat.calls import FunctionCall
from loom_runtime.wire.openai.chat.formats import ToolFormat
from loom_runtime.wire.openai.chat.glm_xml import GlmXml
from loom_runtime.wire.openai.chat.hermes import Hermes
from loom_runtime.wire.openai.chat.llama3_json import Llama3Json
from loom_runtime.wire.openai.chat.tool_stream import ToolCallStream, extract

NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True)
KEY = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
TEXT = st.text(st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), max_size=12)
VALUE = st.one_of(
    TEXT, st.integers(-999, 999), st.booleans(), st.lists(st.integers(0, 9), max_size=3)
)
CALLS = st.lists(st.tuples(NAME, st.dictionaries(KEY, VALUE, max_size=3)), min_size=1, max_size=3)
SCHEMAS: dict[str, Any] = {}  # untyped: every value is read as the JSON it holds


def _glm(calls: list[tuple[str, dict[str, Any]]]) -> str:
    out = []
    for name, args in calls:
        pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>"
                        f"{v if isinstance(v, str) else json.dumps(v)}</arg_value>\n"
                        for k, v in args.items())  # fmt: skip
        out.append(f"<tool_call>{name}\n{pairs}</tool_call>")
    return "".join(out)


def _llama(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def _hermes(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>\n"
                   for n, a in calls)  # fmt: skip


def _streamed(fmt: ToolFormat, text: str, cuts: list[int]) -> tuple[str, list[FunctionCall]]:
    counter = itertools.count()
    stream = ToolCallStream(fmt, SCHEMAS, lambda: f"id{next(counter)}")
    bounds = [0, *sorted(set(c % (len(text) + 1) for c in cuts)), len(text)]
    pieces = [stream.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    pieces.append(stream.finish())
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for d in (d for p in pieces for d in p.calls):
        if d.name is not None:
            names[d.index] = d.name
        args[d.index] = args.get(d.index, "") + d.arguments
    calls = [FunctionCall(names[i], args[i]) for i in sorted(names)]
    return "".join(p.content for p in pieces), calls


@settings(max_examples=150, deadline=None)
@example(calls=[("_", {})], before="\r", kind="glm", cuts=[])  # whitespace alone is no content
@given(
    calls=CALLS,
    before=TEXT,
    kind=st.sampled_from(["glm", "llama", "hermes"]),
    cuts=st.lists(st.integers(0, 10_000)),
)
def test_any_cutting_of_well_formed_calls_streams_to_the_whole_read(
    calls: list[tuple[str, dict[str, Any]]], before: str, kind: str, cuts: list[int]
) -> None:
    fmt: ToolFormat = {"glm": GlmXml(), "llama": Llama3Json(), "hermes": Hermes()}[kind]
    if kind == "llama":
        text = _llama(calls)  # llama-3 calls start the output
    else:
        text = before + (_glm(calls) if kind == "glm" else _hermes(calls))
    whole = extract(fmt, text, SCHEMAS)
    assert [c.name for c in whole.calls] == [n for n, _ in calls]
    content, streamed = _streamed(fmt, text, cuts)
    assert content == (whole.content or "")
    assert streamed == list(whole.calls)
    assert all(isinstance(json.loads(c.arguments), dict) for c in streamed)
