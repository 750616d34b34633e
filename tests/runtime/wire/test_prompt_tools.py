"""The router renders a chat body's prompt as the worker does, tools and the history's calls
included (its prefix scorer hashes these ids); a body the worker would refuse has none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loom_runtime.serve.prepare import chat_messages
from loom_runtime.wire.chat_template import ChatTemplate
from loom_runtime.wire.openai.request import ChatCompletionRequest, parse_request
from loom_runtime.wire.prompt import chat_ids
from loom_runtime.wire.tokenizer import Tokenizer

from .test_chat_template_tools import TEMPLATES, TOOLS

CALL = {"id": "call-1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip
MESSAGES: list[Any] = [
    {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call-1", "content": "Sunny"},
]


@pytest.fixture(scope="module")
def glm_tokenizer(tiny_dir: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_dir(tiny_dir)  # the tiny vocabulary with a template using tools
    source = (TEMPLATES / "glm_tools.jinja").read_text(encoding="utf-8")
    tokenizer.chat_template = ChatTemplate(source, tokenizer.special_tokens)
    return tokenizer


def test_the_routers_ids_are_the_workers_with_tools_and_calls(glm_tokenizer: Tokenizer) -> None:
    tools = [TOOLS[0] | {"x-note": None, "function": TOOLS[0]["function"] | {"strict": None}}]
    body = {"model": "m", "messages": MESSAGES, "tools": tools}
    req = parse_request(ChatCompletionRequest, json.dumps(body).encode())
    rendered = list(req.tool_plan.tools)
    worker = glm_tokenizer.encode_chat(chat_messages(req.messages), True, rendered)
    assert chat_ids(glm_tokenizer, MESSAGES, tools) == worker  # explicit nulls left out alike
    assert chat_ids(glm_tokenizer, MESSAGES, TOOLS) == worker
    assert chat_ids(glm_tokenizer, MESSAGES) != worker  # the tools are part of the prompt


@pytest.mark.parametrize("messages", [
    [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{x"}}]}],
    [{"role": "assistant", "content": None, "tool_calls": "junk"}],
    [{"role": "user", "content": None}],
])  # fmt: skip
def test_a_body_the_worker_refuses_has_no_ids(
    glm_tokenizer: Tokenizer, messages: list[Any]
) -> None:
    assert chat_ids(glm_tokenizer, messages, TOOLS) is None
    assert chat_ids(glm_tokenizer, [{"role": "user", "content": "x"}], "junk") is None
