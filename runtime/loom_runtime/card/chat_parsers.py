"""Which parsers read a chat model's output: tool calls and reasoning, named as vLLM's
`--tool-call-parser` and `--reasoning-parser` name them.

Owns the parser names a card or a family may give and the card section that gives them; never
parses text (loom_runtime.wire.openai.chat does).
"""

from __future__ import annotations

from typing import Literal

from loom_runtime.card.base import CardModel

ToolCallParserName = Literal["llama3_json", "glm45", "glm47", "hermes"]
"""llama3_json: llama-3 templates' `{"name": ..., "parameters": ...}` objects; glm45 / glm47: the
GLM-4.5+ XML-like `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`;
hermes: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Qwen, Hermes templates)."""
ReasoningParserName = Literal["glm45", "deepseek_r1"]
"""glm45: reasoning is a `<think>...</think>` the model opens itself; deepseek_r1: the template
opens `<think>`, so the output is reasoning until `</think>`."""


class ChatParsers(CardModel):
    """How a chat model's output is read back (unset: the family's default)."""

    tool_call_parser: ToolCallParserName | None = None
    """llama3_json | glm45 | glm47 | hermes: parses tool calls out of the output when a request
    sends tools with tool_choice auto (vLLM's --tool-call-parser)."""
    reasoning_parser: ReasoningParserName | None = None
    """glm45 | deepseek_r1: moves thinking into `reasoning` (vLLM's --reasoning-parser)."""
