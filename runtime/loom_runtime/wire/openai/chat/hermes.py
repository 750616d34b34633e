"""The Hermes tool-call format (vLLM's `hermes`, as Qwen's and NousResearch's templates write
it): each call a JSON object `{"name": ..., "arguments": {...}}` between `<tool_call>` and
`</tool_call>`, the content before the first one plain text; the last call may be left open at
the end of the output.

Owns reading that format; never decides what is streamed (tool_stream.py does).
"""

from __future__ import annotations

import json
from typing import Any

from loom_runtime.wire.openai.chat.calls import FunctionCall, PartialCall
from loom_runtime.wire.openai.chat.formats import Schemas, partial_suffix

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class Hermes:
    """hermes."""

    def region_start(self, text: str) -> int | None:
        at = text.find(OPEN)
        return at if at >= 0 else None

    def held_back(self, text: str) -> int:
        return partial_suffix(text, OPEN)

    def calls(self, region: str, schemas: Schemas) -> list[FunctionCall] | None:
        blocks, rest = _blocks(region)
        if rest is not None:  # the last call left open at the end of the output
            if not rest.strip():
                return None
            blocks.append(rest)
        calls = [_call(b) for b in blocks]
        if not calls or any(c is None for c in calls):
            return None
        return [c for c in calls if c is not None]

    def partial(self, region: str, schemas: Schemas) -> list[PartialCall]:
        """The closed calls: an open one is settled only when it closes (or the output ends)."""
        blocks, _ = _blocks(region)
        out: list[PartialCall] = []
        for b in blocks:
            call = _call(b)
            if call is None:
                return out
            out.append(PartialCall(call.name, call.arguments, done=True))
        return out


def _blocks(region: str) -> tuple[list[str], str | None]:
    """The closed calls' bodies, and the body of an open last one (None when all are closed);
    text between calls other than whitespace ends the reading there."""
    found: list[str] = []
    at = 0
    while True:
        start = region.find(OPEN, at)
        if start < 0 or region[at:start].strip():
            return found, None
        end = region.find(CLOSE, start)
        if end < 0:
            return found, region[start + len(OPEN) :]
        found.append(region[start + len(OPEN) : end])
        at = end + len(CLOSE)


def _call(body: str) -> FunctionCall | None:
    try:
        obj: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return FunctionCall(obj["name"], json.dumps(args, ensure_ascii=False))
