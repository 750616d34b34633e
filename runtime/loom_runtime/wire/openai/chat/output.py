"""A chat output read back into an OpenAI message: reasoning first (when the model has a
reasoning parser and no grammar forced the output), then tool calls out of the content as the
request's ToolPlan says. Whole (a message) or as it streams (one delta per step).

Owns combining the readers and the message/delta field names; never does I/O and never decides
the plan's rules (wire/openai/tools.py does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.openai.chat import forced
from loom_runtime.wire.openai.chat.calls import CallIds, message_calls, new_call_id, schemas_of
from loom_runtime.wire.openai.chat.formats import ToolFormat
from loom_runtime.wire.openai.chat.reasoning import ReasoningStream, split
from loom_runtime.wire.openai.chat.registry import TOOL_FORMATS
from loom_runtime.wire.openai.chat.tool_stream import Extracted, Pieces, ToolCallStream, extract
from loom_runtime.wire.openai.tools import ToolPlan

REASONING_FIELDS = ("reasoning", "reasoning_content")
"""Where reasoning goes: vLLM 0.33's name, and the one vLLM used before (and DeepSeek's API)."""


@dataclass(frozen=True)
class OutputPlan:
    """How one request's output is read."""

    tools: ToolPlan
    tool_format: ToolFormat | None = None  # the model's, for tool_choice auto
    reasoning: bool = False  # read `<think>...</think>` out of the output
    include_reasoning: bool = True

    @property
    def plain(self) -> bool:
        """Whether the output is content as it stands (nothing to read out of it)."""
        return self.tools.mode == "none" and not self.reasoning


def output_plan(
    tools: ToolPlan,
    tool_call_parser: str | None,
    reasoning: bool,
    constrained: bool,
    include_reasoning: bool = True,
) -> OutputPlan:
    """The plan for a request on a model with that tool-call parser (a TOOL_FORMATS name) and
    reasoning parser (any: they read alike); `constrained`: a grammar holds the output from its
    first token (it has no room to think, so no reasoning is read)."""
    fmt = None
    if tools.mode == "auto":
        name = tool_call_parser
        if name is None:
            raise InvalidRequestError(
                "tool_choice auto needs a tool-call parser and this model has none: set the "
                "ModelCard's chat.toolCallParser, or send tool_choice required or a function",
                param="tool_choice",
            )
        fmt = TOOL_FORMATS[name]
    return OutputPlan(tools, fmt, reasoning and not constrained, include_reasoning)


@dataclass(frozen=True)
class MessageParts:
    """A whole output read: the message's fields beside `role`."""

    content: str | None
    reasoning: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()

    def fields(self, plan: OutputPlan) -> dict[str, Any]:
        out: dict[str, Any] = {"content": self.content}
        if plan.reasoning and plan.include_reasoning:
            out |= dict.fromkeys(REASONING_FIELDS, self.reasoning)
        if self.tool_calls:
            out["tool_calls"] = list(self.tool_calls)
        return out


def read_message(plan: OutputPlan, text: str, ids: CallIds = new_call_id) -> MessageParts:
    reasoning = None
    if plan.reasoning:
        parts = split(text)
        reasoning, text = parts.reasoning or None, parts.content
    found = _extract(plan, text)
    content = found.content if found.calls or found.content else None
    return MessageParts(content, reasoning, tuple(message_calls(found.calls, ids)))


def _extract(plan: OutputPlan, text: str) -> Extracted:
    tools = plan.tools
    if tools.mode == "named" and tools.named is not None:
        return forced.extract_named(tools.named, text)
    if tools.mode == "required":
        found = forced.extract_required(text)
        return Extracted(found.content, found.calls[: tools.max_calls])
    if tools.mode == "auto" and plan.tool_format is not None:
        return extract(plan.tool_format, text, schemas_of(tools.tools), tools.max_calls)
    return Extracted(text)


class _CallStream(Protocol):
    @property
    def called(self) -> bool: ...

    def feed(self, delta: str) -> Pieces: ...

    def finish(self) -> Pieces: ...


class _Plain:
    called = False

    def feed(self, delta: str) -> Pieces:
        return Pieces(delta)

    def finish(self) -> Pieces:
        return Pieces()


class DeltaStream:
    """One streamed output's deltas (its owner: the response writer)."""

    def __init__(self, plan: OutputPlan, ids: CallIds = new_call_id) -> None:
        self.plan = plan
        self._reasoning = ReasoningStream() if plan.reasoning else None
        self._calls = _call_stream(plan, ids)

    @property
    def called(self) -> bool:
        """Whether the output made a call (auto and required finish with `tool_calls`)."""
        return self._calls.called

    def step(self, text: str, last: bool = False) -> dict[str, Any]:
        """The delta for new output text ({} when nothing can be sent yet); `last`: the output
        has ended, so what was held back goes too."""
        reasoning, content = "", text
        if self._reasoning is not None:
            part = self._reasoning.feed(text)
            reasoning, content = part.reasoning, part.content
            if last:
                tail = self._reasoning.finish()
                reasoning, content = reasoning + tail.reasoning, content + tail.content
        pieces = self._calls.feed(content)
        if last:
            end = self._calls.finish()
            pieces = Pieces(pieces.content + end.content, pieces.calls + end.calls)
        return self._delta(reasoning, pieces)

    def _delta(self, reasoning: str, pieces: Pieces) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if reasoning and self.plan.include_reasoning:
            out |= dict.fromkeys(REASONING_FIELDS, reasoning)
        if pieces.content:
            out["content"] = pieces.content
        if pieces.calls:
            out["tool_calls"] = [c.to_json() for c in pieces.calls]
        return out


def finish_reason(plan: OutputPlan, called: bool, reason: str | None) -> str | None:
    """vLLM's: `tool_calls` when tool_choice auto made a call, or `required`'s calls ended;
    a named function's call finishes as the output did (`stop`), as OpenAI's does."""
    if called and (
        plan.tools.mode == "auto" or (plan.tools.mode == "required" and reason == "stop")
    ):
        return "tool_calls"
    return reason


def _call_stream(plan: OutputPlan, ids: CallIds) -> _CallStream:
    tools = plan.tools
    if tools.mode == "named" and tools.named is not None:
        return forced.NamedCallStream(tools.named, ids)
    if tools.mode == "required":
        return forced.RequiredCallStream(ids, tools.max_calls)
    if tools.mode == "auto" and plan.tool_format is not None:
        return ToolCallStream(plan.tool_format, schemas_of(tools.tools), ids, tools.max_calls)
    return _Plain()
