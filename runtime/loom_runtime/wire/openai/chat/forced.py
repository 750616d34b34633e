"""Calls the grammar forced (tool_choice `required` or a named function): the output is JSON, a
named function's arguments or vLLM's array of `{"name", "parameters"}` objects, read as calls
whole or as it streams. An output cut short (max_tokens) is what it is: a named call's arguments
are sent as written; an unreadable array is content.

Owns reading forced output; never builds the grammar (wire/openai/tools.py does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from loom_runtime.wire.openai.chat.calls import CallDelta, CallIds, FunctionCall
from loom_runtime.wire.openai.chat.tool_stream import Extracted, Pieces

_DECODER = json.JSONDecoder()


def extract_named(name: str, text: str) -> Extracted:
    return Extracted(None, (FunctionCall(name, text),))


def extract_required(text: str) -> Extracted:
    calls, rest, _ = _array_calls(text)
    if calls is None or rest.strip() or not calls:
        return Extracted(text)
    return Extracted(None, tuple(calls))


def _array_calls(text: str) -> tuple[list[FunctionCall] | None, str, bool]:
    """The calls of the complete items at the array's start, what follows them, and whether the
    array is closed; None when the text is not such an array."""
    body = text.lstrip()
    if not body:
        return [], "", False
    if not body.startswith("["):
        return None, text, False
    at, out = 1, list[FunctionCall]()
    while True:
        while at < len(body) and body[at] in " \t\r\n,":
            at += 1
        if at < len(body) and body[at] == "]":
            return out, body[at + 1 :], True
        try:
            item, end = _DECODER.raw_decode(body, at)
        except ValueError:
            return out, body[at:], False
        call = _call(item)
        if call is None:
            return None, text, False
        out.append(call)
        at = end


def _call(item: Any) -> FunctionCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    params = item.get("parameters")
    if not isinstance(params, dict):
        return None
    return FunctionCall(item["name"], json.dumps(params, ensure_ascii=False))


@dataclass
class NamedCallStream:
    """A named function's call: its id and name first, then the output as arguments."""

    name: str
    ids: CallIds
    called: bool = False

    def feed(self, delta: str) -> Pieces:
        if not self.called:
            self.called = True
            return Pieces("", (CallDelta(0, delta, self.ids(), self.name),))
        return Pieces("", (CallDelta(0, delta),) if delta else ())

    def finish(self) -> Pieces:
        return Pieces() if self.called else self.feed("")


@dataclass
class RequiredCallStream:
    """`required`'s array: each call sent whole once its item is complete."""

    ids: CallIds
    max_calls: int | None = None
    _text: str = ""
    _sent: int = 0
    _dead: bool = False  # not an array of calls: the rest is content
    _calls: list[FunctionCall] = field(default_factory=list)

    @property
    def called(self) -> bool:
        return self._sent > 0

    def feed(self, delta: str) -> Pieces:
        self._text += delta
        return self._step(final=False)

    def finish(self) -> Pieces:
        return self._step(final=True)

    def _step(self, final: bool) -> Pieces:
        if self._dead:
            return Pieces()
        calls, _, _ = _array_calls(self._text)
        if calls is None:
            if self._sent:
                self._dead = True
                return Pieces()
            return Pieces(self._text) if final else Pieces()
        if final and not calls and not self._sent:
            return Pieces(self._text)
        out = []
        for call in calls[self._sent : self.max_calls]:
            out.append(CallDelta(self._sent, call.arguments, self.ids(), call.name))
            self._sent += 1
        return Pieces("", tuple(out))
