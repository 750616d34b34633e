"""The token ids a request's prompt becomes, exactly as a worker computes them.

Owns joining a message's text parts, the messages a chat template is rendered with, and a raw
request body's prompt ids (the router's precise prefix scorer hashes them); never checks sampling
fields, and the body readers never raise (the worker validates requests, the router routes them).
"""

from __future__ import annotations

from collections.abc import Mapping
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


def template_message(role: str, content: str, name: str | None) -> dict[str, Any]:
    """One message as the chat template sees it (a name only when one is given)."""
    return {"role": role, "content": content} | ({"name": name} if name else {})


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


def chat_ids(tokenizer: Tokenizer, messages: Any) -> list[int] | None:
    """A /v1/chat/completions prompt's ids (the template with a generation prompt); None when
    the messages cannot be rendered."""
    if not isinstance(messages, list) or not messages:
        return None
    plain: list[dict[str, Any]] = []
    size = 0
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            return None
        try:
            content = join_text_parts(message.get("content"))
        except ValueError:
            return None
        name = message.get("name")
        size += len(content)
        plain.append(template_message(message["role"], content, name if _text(name) else None))
    if size > MAX_PROMPT_CHARS:
        return None
    try:
        return tokenizer.encode_chat(plain, add_generation_prompt=True)
    except InvalidRequestError:
        return None


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)
