"""The GLM-4.5+ tool-call format (vLLM's `glm45` and `glm47`): `<tool_call>NAME` then
`<arg_key>K</arg_key><arg_value>V</arg_value>` pairs, then `</tool_call>`; the name ends at a
newline (GLM-4.5) or at the first `<arg_key>` (GLM-4.7, which also writes calls without
arguments). A value is JSON unless the function's schema types it as a string. Text after the
last call is dropped, as vLLM's reader does.

Owns reading that format; never decides what is streamed (tool_stream.py does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from loom_runtime.wire.openai.chat.calls import FunctionCall, PartialCall
from loom_runtime.wire.openai.chat.formats import Schemas, partial_suffix

START, END = "<tool_call>", "</tool_call>"
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_NAME_END = re.compile(r"\n|<arg_key>|</tool_call>")


class GlmXml:
    """glm45 / glm47 (one reader: it accepts both placements of the name)."""

    def region_start(self, text: str) -> int | None:
        at = text.find(START)
        return None if at < 0 else at

    def held_back(self, text: str) -> int:
        return partial_suffix(text, START)

    def calls(self, region: str, schemas: Schemas) -> list[FunctionCall] | None:
        out: list[FunctionCall] = []
        at = 0
        while region[at:].strip():
            at = len(region) - len(region[at:].lstrip())
            if not region.startswith(START, at):
                return out or None
            end = region.find(END, at)
            if end < 0:
                return None
            call = _one(region[at + len(START) : end], schemas)
            if call is None:
                return None
            out.append(call)
            at = end + len(END)
        return out or None

    def partial(self, region: str, schemas: Schemas) -> list[PartialCall]:
        out: list[PartialCall] = []
        at = 0
        while True:
            at = len(region) - len(region[at:].lstrip())
            if not region.startswith(START, at):
                return out
            end = region.find(END, at)
            body = region[at + len(START) : None if end < 0 else end]
            if end >= 0:
                call = _one(body, schemas)
                if call is None:
                    return out
                out.append(PartialCall(call.name, call.arguments, done=True))
                at = end + len(END)
                continue
            name_end = _NAME_END.search(body)
            if name_end is None or not _name_ok(body[: name_end.start()].strip()):
                return out
            name = body[: name_end.start()].strip()
            pairs, _ = _pairs(body[name_end.start() :])
            args = _arguments(name, pairs, schemas, closed=False)
            return [*out, PartialCall(name, args)]


def _name_ok(name: str) -> bool:
    return bool(name) and "<" not in name and ">" not in name


def _pairs(text: str) -> tuple[list[tuple[str, str]], str]:
    """The complete key/value pairs at the start of `text`, and what follows them."""
    pairs: list[tuple[str, str]] = []
    at = 0
    while (match := _PAIR.match(text, at)) is not None:
        pairs.append((match.group(1).strip(), match.group(2)))
        at = match.end()
    return pairs, text[at:]


def _one(body: str, schemas: Schemas) -> FunctionCall | None:
    name_end = _NAME_END.search(body)
    cut = len(body) if name_end is None else name_end.start()
    name = body[:cut].strip()
    if not _name_ok(name):
        return None
    pairs, rest = _pairs(body[cut:])
    if rest.strip():
        return None
    return FunctionCall(name, _arguments(name, pairs, schemas, closed=True))


def _arguments(name: str, pairs: list[tuple[str, str]], schemas: Schemas, closed: bool) -> str:
    """The arguments' JSON text, written pair by pair so that an open call's text is a prefix
    of the closed one's ("" while an open call has no pair yet)."""
    if not pairs and not closed:
        return ""
    props = _properties(schemas.get(name, {}))
    items = [f"{json.dumps(k, ensure_ascii=False)}: "
             f"{json.dumps(_value(v, props.get(k)), ensure_ascii=False)}"
             for k, v in pairs]  # fmt: skip
    return "{" + ", ".join(items) + ("}" if closed else "")


def _properties(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, Mapping) else {}


def _value(raw: str, schema: Any) -> Any:
    """A string where the schema says string (or says nothing it could parse as), else the
    JSON the template wrote (`tojson`), else the text as it stands."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    kinds = kind if isinstance(kind, list) else [kind]
    if "string" in kinds:
        return raw
    try:
        return json.loads(raw.strip())
    except ValueError:
        return raw
