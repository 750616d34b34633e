"""The llama-3 JSON tool-call format (vLLM's `llama3_json`): the output is one or more
`{"name": ..., "parameters": {...}}` objects (or `"arguments"`), separated by `;`, either from the
output's start or after a `<|python_tag|>`.

Owns reading that format; never decides what is streamed (tool_stream.py does).
"""

from __future__ import annotations

import json
from typing import Any

from loom_runtime.wire.openai.chat.calls import FunctionCall, PartialCall
from loom_runtime.wire.openai.chat.formats import Schemas, partial_suffix

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class Llama3Json:
    """llama3_json."""

    def region_start(self, text: str) -> int | None:
        tag = text.find(PYTHON_TAG)
        if tag >= 0:
            return tag
        return 0 if text.lstrip().startswith("{") else None

    def held_back(self, text: str) -> int:
        if not text.strip():
            return len(text)  # leading whitespace may come before a call's `{`
        return partial_suffix(text, PYTHON_TAG)

    def calls(self, region: str, schemas: Schemas) -> list[FunctionCall] | None:
        found, rest = _objects(region)
        if not found or rest.strip():
            return None
        calls = [_call(obj) for obj in found]
        return None if any(c is None for c in calls) else [c for c in calls if c is not None]

    def partial(self, region: str, schemas: Schemas) -> list[PartialCall]:
        """The complete calls, the last one only once a separator follows it (text after it
        may still make the whole output plain content)."""
        found, rest = _objects(region)
        out: list[PartialCall] = []
        for obj in found:
            call = _call(obj)
            if call is None:
                return out[:-1]
            out.append(PartialCall(call.name, call.arguments, done=True))
        return out if rest.lstrip(" \t\r\n").startswith((";", "{")) else out[:-1]


def _objects(region: str) -> tuple[list[Any], str]:
    """The complete JSON values at the region's start (after the tag), separated by `;` or
    whitespace, and the text after the last of them."""
    text = region.removeprefix(PYTHON_TAG)
    found: list[Any] = []
    at = 0
    while True:
        start = at
        while start < len(text) and text[start] in " \t\r\n;":
            start += 1
        if start >= len(text) or (found and text[at:start].strip(" \t\r\n") not in ("", ";")):
            return found, text[at:]
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            return found, text[at:]
        found.append(value)
        at = end


def _call(obj: Any) -> FunctionCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("parameters", obj.get("arguments"))
    if not isinstance(args, dict):
        return None
    return FunctionCall(obj["name"], json.dumps(args, ensure_ascii=False))
