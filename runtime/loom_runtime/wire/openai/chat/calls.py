"""Tool calls as the parsers find them and as OpenAI's wire writes them: whole calls on a message,
and the `tool_calls` deltas of a stream.

Owns the shapes and the call ids; never parses model output (the format modules do).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CallIds = Callable[[], str]
"""Makes a tool call's id (tests pass a counter)."""


def new_call_id() -> str:
    """A fresh tool-call id, as vLLM spells them."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class FunctionCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class PartialCall:
    """A call as far as the output has written it: its name once complete, the prefix of its
    arguments' JSON text that can no longer change, and whether the call is closed."""

    name: str | None
    arguments: str = ""
    done: bool = False


@dataclass(frozen=True)
class CallDelta:
    """One `tool_calls` delta: a new call's id and name (once), then arguments fragments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            out |= {"id": self.id, "type": "function"}
        if self.name is not None:
            function = {"name": self.name} | function
        return out | {"function": function}


def message_calls(calls: Sequence[FunctionCall], ids: CallIds) -> list[dict[str, Any]]:
    """A message's `tool_calls`."""
    return [{"id": ids(), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]  # fmt: skip


def schemas_of(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """Function name -> its parameters' JSON schema ({} where none is given)."""
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools or ():
        function = tool.get("function") or {}
        params = function.get("parameters")
        out[str(function.get("name"))] = params if isinstance(params, Mapping) else {}
    return out
