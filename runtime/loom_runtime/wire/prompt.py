"""The token ids a request's prompt becomes, exactly as a worker computes them.

Owns joining a message's text parts, the messages a chat template is rendered with, and a raw
request body's prompt ids (the router's precise prefix scorer hashes them); never checks sampling
fields, and the body readers never raise (the worker validates requests, the router routes them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.tokenizer import Tokenizer

MAX_PROMPT_CHARS = 4 << 20
"""Longer prompts are not tokenized for routing (the worker refuses them anyway)."""


def join_text_parts(content: object) -> str:
    """Message content: a string, or a list of text parts joined into one; ValueError else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"part {i} has type {kind!r}; only 'text' parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError(f"part {i} has no string 'text'")
            texts.append(text)
        return "".join(texts)
    raise ValueError("content must be a string or a list of text parts")


def template_message(
    role: str,
    content: str | None,
    name: str | None,
    tool_calls: Sequence[Mapping[str, Any]] | None = None,
    tool_call_id: str | None = None,
) -> dict[str, Any]:
    """One message as the chat template sees it (a name only when one is given). An assistant's
    calls carry their arguments as a JSON value, not text (templates iterate them, as vLLM
    passes them); a tool message names the call it answers. ValueError on unreadable
    arguments."""
    out: dict[str, Any] = {"role": role, "content": content} | ({"name": name} if name else {})
    if tool_calls:
        out["tool_calls"] = [_template_call(c) for c in tool_calls]
    if tool_call_id is not None:
        out["tool_call_id"] = tool_call_id
    return out


def _template_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError("a tool call needs function.name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        raise ValueError("a tool call's function.arguments must be JSON text")
    called = {"name": function["name"], "arguments": call_arguments(arguments)}
    return {"id": call.get("id"), "type": "function", "function": called}


def template_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tools as the chat template sees them: each tool and its function without null fields
    (as if the client had left them out), the parameters' schema as given."""
    out = []
    for tool in tools:
        plain = {k: v for k, v in tool.items() if v is not None}
        function = plain.get("function")
        if isinstance(function, Mapping):
            plain["function"] = {k: v for k, v in function.items() if v is not None}
        out.append(plain)
    return out


def call_arguments(text: str) -> Any:
    """A call's arguments text as the JSON value it holds; ValueError if it is not JSON."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None


def completion_ids(tokenizer: Tokenizer, prompt: Any) -> list[int] | None:
    """A /v1/completions prompt's ids: token ids as given, text encoded with special tokens;
    of a list of prompts, the first's (its prefix routes the request); None when the prompt is
    not one the worker would accept."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
        return list(prompt)
    if isinstance(prompt, str) and 0 < len(prompt) <= MAX_PROMPT_CHARS:
        return tokenizer.encode(prompt)
    return None


def chat_ids(
    tokenizer: Tokenizer, messages: Any, tools: Any = None, extra: Any = None
) -> list[int] | None:
    """A /v1/chat/completions prompt's ids (the template with a generation prompt, the
    request's tools and chat_template_kwargs); None when the messages cannot be rendered."""
    if extra is not None and not isinstance(extra, Mapping):
        return None
    if not isinstance(messages, list) or not messages:
        return None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, Mapping)
                                                                  for t in tools)):  # fmt: skip
        return None
    plain: list[dict[str, Any]] = []
    size = 0
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            return None
        try:
            plain.append(_raw_message(message))
        except ValueError:
            return None
        size += len(plain[-1]["content"] or "")
    if size > MAX_PROMPT_CHARS:
        return None
    try:
        rendered = None if tools is None else template_tools(tools)
        return tokenizer.encode_chat(plain, True, rendered, extra)
    except InvalidRequestError:
        return None


def _raw_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A raw body's message as the template sees it; ValueError where the worker refuses it."""
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, Mapping)
                                                                  for c in calls)):  # fmt: skip
        raise ValueError("tool_calls must be a list of calls")
    raw = message.get("content")
    content = None if raw is None and calls else join_text_parts(raw)
    name, call_id = message.get("name"), message.get("tool_call_id")
    return template_message(message["role"], content, name if _text(name) else None, calls,
                            call_id if isinstance(call_id, str) else None)  # fmt: skip


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)
