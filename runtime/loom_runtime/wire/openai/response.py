"""OpenAI response bodies and stream chunks: completions and chat, with vLLM's
`return_token_ids` placement.

Owns the JSON shapes (head fields, choices, where token ids go, usage); never does I/O and
never decides what a chunk says (the worker's server and the router's stream tracker do).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

ResponseKind = Literal["completion", "chat"]
HEAD_FIELDS = ("id", "object", "created", "model", "system_fingerprint")
"""What every body and chunk of one response repeats, in this order."""


def chunk_object(kind: ResponseKind) -> str:
    """The `object` of a stream chunk (a completions chunk keeps the body's)."""
    return "chat.completion.chunk" if kind == "chat" else "text_completion"


def body_object(kind: ResponseKind) -> str:
    """The `object` of a non-streamed body."""
    return "chat.completion" if kind == "chat" else "text_completion"


@dataclass(frozen=True)
class ResponseMeta:
    """What every body and chunk of one response repeats."""

    id: str
    created: int
    model: str
    weights_version: str  # also sent as system_fingerprint and the x-loom-weights-version header

    def head(self, obj: str) -> dict[str, Any]:
        return dict(zip(HEAD_FIELDS, (self.id, obj, self.created, self.model,
                                      self.weights_version), strict=True))  # fmt: skip

    def chunk_head(self, kind: ResponseKind) -> dict[str, Any]:
        """The head of every stream chunk of a `kind` response."""
        return self.head(chunk_object(kind))


def add_token_ids(
    kind: ResponseKind,
    body: dict[str, Any],
    choice: dict[str, Any],
    token_ids: Sequence[int] | None,
    prompt_token_ids: Sequence[int] | None,
) -> None:
    """`return_token_ids` (vLLM's placement): the choice's `token_ids`; the prompt's ids on the
    choice of a completion and at the top of a chat response."""
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    if prompt_token_ids is not None:
        (body if kind == "chat" else choice)["prompt_token_ids"] = list(prompt_token_ids)


def full_body(
    kind: ResponseKind,
    meta: ResponseMeta,
    text: str,
    finish_reason: str | None,
    usage: dict[str, Any],
    logprobs: dict[str, Any] | None,
    token_ids: Sequence[int] = (),
    prompt_token_ids: Sequence[int] | None = None,
    message: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A non-streamed response; with `prompt_token_ids` (return_token_ids) also every id. A
    chat's `message` fields beside the role (content, reasoning, tool_calls) replace `text`."""
    choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
    if kind == "chat":
        fields = {"content": text} if message is None else dict(message)
        choice["message"] = {"role": "assistant", **fields}
    else:
        choice["text"] = text
    body = meta.head(body_object(kind))
    body["choices"] = [choice]
    if prompt_token_ids is not None:
        add_token_ids(kind, body, choice, token_ids, prompt_token_ids)
    body["usage"] = usage
    return body


def chunk(
    kind: ResponseKind,
    head: Mapping[str, Any],
    text: str | None,
    logprobs: Any,
    finish_reason: Any,
    with_usage_field: bool,
    role: bool = False,
    token_ids: Sequence[int] | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    usage: Mapping[str, Any] | None = None,
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chunk after `head` (the HEAD_FIELDS, `object` as chunk_object says). Chat
    chunks carry a delta; the first has the role; `fields` (content, reasoning, tool_calls, as
    the output's reader made them) replace `text` in it. With return_token_ids every chunk has
    its new `token_ids` and the first the prompt's. `usage` (vLLM's continuous_usage_stats) is
    the usage so far; else `usage: null` when asked for."""
    choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if fields is not None:
            delta |= fields
        elif text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    body = dict(head)
    body["choices"] = [choice]
    add_token_ids(kind, body, choice, token_ids, prompt_token_ids)
    if usage is not None:
        body["usage"] = usage
    elif with_usage_field:
        body["usage"] = None
    return body


def usage_chunk(head: Mapping[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage is set: no choices, only usage."""
    body = dict(head)
    body["choices"] = []
    body["usage"] = usage
    return body
