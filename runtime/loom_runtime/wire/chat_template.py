"""Render a checkpoint's Jinja chat template in a sandbox, the way Hugging Face does.

Checks and normalises the messages it is given; never tokenizes and never trusts the template.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from loom_runtime.errors import CheckpointError, InvalidRequestError


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML; chat templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(self, source: str, special_tokens: Mapping[str, str | None]) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise CheckpointError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self._special = dict(special_tokens)
        # OpenAI's `developer` role is its newer name for `system`; a template that never
        # mentions it would refuse it or drop it, so it is rendered as `system` there (vLLM's
        # templates see it as given, and the ones that know it handle it).
        self.knows_developer = "developer" in source

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text; InvalidRequestError if a message is bad or the template rejects it.
        `extra`: the request's chat_template_kwargs (e.g. enable_thinking), beside the template's
        own variables, which it may not set."""
        plain = normalise_messages(messages)
        if not self.knows_developer:
            plain = [m | {"role": "system"} if m["role"] == "developer" else m for m in plain]
        context = {
            **self._checked(extra or {}),
            **self._special,
            "messages": plain,
            "add_generation_prompt": add_generation_prompt,
            "tools": None if tools is None else _plain(tools, "tools"),
        }
        try:
            return self._template.render(**context)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise InvalidRequestError(
                f"the chat template rejected the messages: {exc}", param="messages"
            ) from exc

    def _checked(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        clash = _reserved_clash(extra, self._special)
        if clash is not None:
            raise InvalidRequestError(
                f"chat_template_kwargs.{clash}: the request itself sets it (messages, tools, "
                "add_generation_prompt and the tokenizer's special tokens cannot be overridden)",
                param="chat_template_kwargs",
            )
        return dict(extra)


RESERVED = ("messages", "add_generation_prompt", "tools")


def _reserved_clash(extra: Mapping[str, Any], special: Mapping[str, Any]) -> str | None:
    return next((k for k in extra if k in RESERVED or k in special), None)


def normalise_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Check role/content of each message; join OpenAI text parts into one string."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidRequestError("messages must be a non-empty list", param="messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"{where} must be an object", param=where)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequestError(f"{where}.role must be a non-empty string", param=where)
        plain = _plain(message, where)
        plain["content"] = _content(message.get("content"), f"{where}.content")
        out.append(plain)
    return out


def _content(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where} must be a string or a list of parts", param=where)
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequestError(
                f"{where}[{j}] must be a text part ({{'type': 'text', 'text': ...}}); "
                f"this model takes text only, got type {kind!r}",
                param=where,
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _plain(value: Any, where: str) -> Any:
    """A copy made of JSON types only, so the sandboxed template never sees a live object."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, f"{where}[{j}]") for j, v in enumerate(value)]
    raise InvalidRequestError(f"{where} holds a {type(value).__name__}, not JSON", param=where)
