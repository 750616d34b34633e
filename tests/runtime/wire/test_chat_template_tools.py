"""Tools through the chat template: the tiny checkpoint's template ignores them (so a tools
request renders as its messages alone); a llama-3-style and a GLM-style template (test fixtures)
render the tool definitions, an assistant's earlier calls and the tool's answer, and each model
family's parser reads back the calls its template writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loom_runtime.models.tiny_tokenizer import CHAT_TEMPLATE
from loom_runtime.wire.chat_template import ChatTemplate
from loom_runtime.wire.openai.chat.calls import FunctionCall
from loom_runtime.wire.openai.chat.registry import TOOL_FORMATS
from loom_runtime.wire.openai.chat.tool_stream import extract
from loom_runtime.wire.prompt import template_message

TEMPLATES = Path(__file__).parent / "templates"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}]  # fmt: skip
ARGS = '{"city": "Oslo", "days": 2}'
CALL = {"id": "call-1", "type": "function",
        "function": {"name": "get_weather", "arguments": ARGS}}  # fmt: skip
HISTORY = [
    template_message("user", "Weather in Oslo?", None),
    template_message("assistant", None, None, [CALL]),
    template_message("tool", "Sunny, 21 C", None, tool_call_id="call-1"),
]
SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def _template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(encoding="utf-8"), SPECIAL)


def test_the_tiny_checkpoints_template_ignores_tools_and_calls() -> None:
    tiny = ChatTemplate(CHAT_TEMPLATE, {"bos_token": "<|begin_of_text|>"})
    with_tools = tiny.render(HISTORY, tools=TOOLS)
    assert with_tools == tiny.render(HISTORY)
    assert "get_weather" not in with_tools and "<|im_start|>tool\nSunny, 21 C" in with_tools


@pytest.mark.parametrize(("name", "parser"), [("llama3_tools.jinja", "llama3_json"),
                                              ("glm_tools.jinja", "glm47")])  # fmt: skip
def test_a_tool_template_renders_tools_calls_and_results(name: str, parser: str) -> None:
    text = _template(name).render(HISTORY, tools=TOOLS)
    assert json.dumps(TOOLS[0]) in text  # the definitions, as the template's tojson writes them
    assert "Sunny, 21 C" in text
    assert _template(name).render(HISTORY) != text


def _assistant_turn(name: str) -> str:
    """The text the template writes for the assistant's call (what the model learnt to emit)."""
    template = _template(name)
    before = template.render(HISTORY[:1], add_generation_prompt=True, tools=TOOLS)
    after = template.render(HISTORY[:2], add_generation_prompt=False, tools=TOOLS)
    assert after.startswith(before.removesuffix("<think>"))
    return after[len(before.removesuffix("<think>")) :]


@pytest.mark.parametrize(
    ("name", "parser", "cut"),
    [("llama3_tools.jinja", "llama3_json", "<|eot_id|>"), ("glm_tools.jinja", "glm45", ""),
     ("glm_tools.jinja", "glm47", "")],
)  # fmt: skip
def test_each_parser_reads_back_the_calls_its_template_writes(
    name: str, parser: str, cut: str
) -> None:
    turn = _assistant_turn(name).removeprefix("\n<|assistant|>").removesuffix(cut)
    schemas: dict[str, Any] = {"get_weather": TOOLS[0]["function"]["parameters"]}  # type: ignore[index]
    found = extract(TOOL_FORMATS[parser], turn, schemas)  # type: ignore[index]
    assert found.calls == (FunctionCall("get_weather", '{"city": "Oslo", "days": 2}'),)


def test_every_parser_name_a_card_may_give_has_a_reader() -> None:
    from typing import get_args

    from loom_runtime.card.chat_parsers import ToolCallParserName

    assert set(TOOL_FORMATS) == set(get_args(ToolCallParserName))
