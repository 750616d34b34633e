"""A finished response as the Responses API returns it: output items (reasoning, the assistant
message, function calls) from the chat output read back, the response object around them, and
the chat messages a later response continues from.

Owns the response object's shape and its item ids; never reads model output itself (the chat
reader, wire/openai/chat/output.py, does) and never stores anything.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from loom_runtime.wire.openai.chat.output import MessageParts
from loom_runtime.wire.openai.responses.request import ChatMessageDict, ResponsesRequest

Status = Literal["in_progress", "completed", "incomplete"]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(text: str, id_: str, status: Status = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": id_,
        "status": status,
        "role": "assistant",
        "content": [] if status == "in_progress" else [output_text(text)],
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(text: str, id_: str, status: Status = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": id_, "summary": [], "content": content, "status": status}


def function_call_item(
    call_id: str, name: str, arguments: str, id_: str, status: Status = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": id_,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_items(parts: MessageParts, include_reasoning: bool) -> list[dict[str, Any]]:
    """A whole output read back: reasoning, then the message, then each function call."""
    items = []
    if parts.reasoning and include_reasoning:
        items.append(reasoning_item(parts.reasoning, item_id("rs")))
    if parts.content:
        items.append(message_item(parts.content, item_id("msg")))
    for call in parts.tool_calls:
        fn = call["function"]
        items.append(function_call_item(call["id"], fn["name"], fn["arguments"], item_id("fc")))
    return items


def continued(
    messages: Sequence[ChatMessageDict], items: Sequence[dict[str, Any]]
) -> list[ChatMessageDict]:
    """The conversation a later response continues: `messages` (without instructions) and this
    response's output as the assistant's turn (its reasoning not kept, as chat templates drop
    past thinking)."""
    text = "".join(part["text"] for i in items if i["type"] == "message" for part in i["content"])
    calls = [
        {"id": i["call_id"], "type": "function",
         "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in items
        if i["type"] == "function_call"
    ]  # fmt: skip
    turn: ChatMessageDict = {"role": "assistant", "content": text or None}
    if calls:
        turn["tool_calls"] = calls
    return [*messages, turn]


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def body(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass(frozen=True)
class ResponseHead:
    """What every view of one response repeats: its id, when, and the request's settings."""

    id: str
    model: str
    request: ResponsesRequest
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(
        self,
        status: Status,
        output: Sequence[dict[str, Any]] = (),
        usage: Usage | None = None,
        incomplete: str | None = None,
    ) -> dict[str, Any]:
        req = self.request
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if (
            req.text is not None and req.text.format is not None
        ) else {"type": "text"}  # fmt: skip
        tools = [t.model_dump(exclude_none=True) for t in req.tools or ()]
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None if incomplete is None else {"reason": incomplete},
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": dict(req.metadata or {}),
            "model": self.model,
            "output": list(output),
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": None,
            "service_tier": "default",
            "store": req.store,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": fmt},
            "tool_choice": "auto" if req.tool_choice is None else req.tool_choice,
            "tools": tools,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "usage": None if usage is None else usage.body(),
            "user": (req.model_extra or {}).get("user"),
        }


def final_status(finish_reason: str | None) -> tuple[Status, str | None]:
    """The response's status and incomplete reason for the output's finish reason."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None
