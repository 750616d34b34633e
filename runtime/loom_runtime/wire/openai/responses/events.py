"""A response as it streams: the Responses API's events, each with its sequence number, from
the deltas the chat reader gives step by step (content, reasoning, tool-call fragments).

One output item is open at a time: a delta of another kind (or another call) closes it with its
`.done` events. Owns the event names and fields; never reads model output itself (the chat
DeltaStream does) and never writes to the network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loom_runtime.wire.openai.chat.output import REASONING_FIELDS
from loom_runtime.wire.openai.responses.output import (
    ResponseHead,
    Status,
    Usage,
    function_call_item,
    item_id,
    message_item,
    output_text,
    reasoning_item,
)

Event = dict[str, Any]


@dataclass
class _Open:
    """The output item being streamed."""

    kind: str  # "message", "reasoning" or "function_call"
    id: str
    index: int  # its output_index
    text: str = ""
    call_id: str = ""
    name: str = ""
    call_index: int = -1  # a function call's index among chat's tool_calls


class EventStream:
    """The events of one response, in order (its owner: the response writer)."""

    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self.items: list[dict[str, Any]] = []  # output items done so far
        self._seq = 0
        self._open: _Open | None = None

    def _event(self, type_: str, **fields: Any) -> Event:
        event = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def start(self) -> list[Event]:
        body = self.head.body("in_progress")
        return [self._event("response.created", response=body),
                self._event("response.in_progress", response=body)]  # fmt: skip

    def step(self, delta: Mapping[str, Any]) -> list[Event]:
        """The events for one chat delta (DeltaStream.step's)."""
        out: list[Event] = []
        reasoning = delta.get(REASONING_FIELDS[0])
        if reasoning:
            out += self._text("reasoning", reasoning)
        if delta.get("content"):
            out += self._text("message", delta["content"])
        for call in delta.get("tool_calls", ()):
            out += self._call(call)
        return out

    def finish(self, status: Status, usage: Usage, incomplete: str | None) -> list[Event]:
        """Close the open item; the last event carries the whole response."""
        out = self._close()
        body = self.head.body(status, self.items, usage, incomplete)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self._event(kind, response=body)]

    def error(self, code: str | None, message: str, param: str | None) -> list[Event]:
        return [self._event("error", code=code, message=message, param=param)]

    # --- items -------------------------------------------------------------------------------

    def _text(self, kind: str, delta: str) -> list[Event]:
        out: list[Event] = []
        item = self._open
        if item is None or item.kind != kind:
            out += self._close()
            item = self._start(kind)
            if kind == "message":
                item_ = message_item("", item.id, "in_progress")
            else:
                item_ = reasoning_item("", item.id, "in_progress")
            out.append(self._event("response.output_item.added", output_index=item.index,
                                   item=item_))  # fmt: skip
            if kind == "message":
                out.append(self._event("response.content_part.added", item_id=item.id,
                                       output_index=item.index, content_index=0,
                                       part=output_text("")))  # fmt: skip
        item.text += delta
        name = (
            "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        )
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        out.append(self._event(name, item_id=item.id, output_index=item.index, content_index=0,
                               delta=delta, **extra))  # fmt: skip
        return out

    def _call(self, call: Mapping[str, Any]) -> list[Event]:
        out: list[Event] = []
        fn = call.get("function") or {}
        item = self._open
        if item is None or item.kind != "function_call" or item.call_index != call.get("index"):
            out += self._close()
            item = self._start("function_call")
            item.call_index = int(call.get("index", 0))
            item.call_id, item.name = str(call.get("id", "")), str(fn.get("name", ""))
            added = function_call_item(item.call_id, item.name, "", item.id, "in_progress")
            out.append(self._event("response.output_item.added", output_index=item.index,
                                   item=added))  # fmt: skip
        arguments = fn.get("arguments") or ""
        if arguments:
            item.text += arguments
            out.append(self._event("response.function_call_arguments.delta", item_id=item.id,
                                   output_index=item.index, delta=arguments))  # fmt: skip
        return out

    def _start(self, kind: str) -> _Open:
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        self._open = _Open(kind, item_id(prefix), len(self.items))
        return self._open

    def _close(self) -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        at = {"item_id": item.id, "output_index": item.index}
        if item.kind == "message":
            done = message_item(item.text, item.id)
            out = [self._event("response.output_text.done", **at, content_index=0,
                               text=item.text, logprobs=[]),
                   self._event("response.content_part.done", **at, content_index=0,
                               part=output_text(item.text))]  # fmt: skip
        elif item.kind == "reasoning":
            done = reasoning_item(item.text, item.id)
            out = [self._event("response.reasoning_text.done", **at, content_index=0,
                               text=item.text)]  # fmt: skip
        else:
            done = function_call_item(item.call_id, item.name, item.text, item.id)
            out = [self._event("response.function_call_arguments.done", **at,
                               name=item.name, arguments=item.text)]  # fmt: skip
        self.items.append(done)
        return [*out, self._event("response.output_item.done", output_index=item.index,
                                  item=done)]  # fmt: skip
