"""OpenAI response bodies and stream chunks, built from what the engine reported.

Owns the JSON shapes (ids, usage, logprobs, system_fingerprint); never does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from loom_runtime.engine.types import RequestOutput, TokenLogprob

Kind = Literal["completion", "chat"]
TokenText = Callable[[int], str]


@dataclass(frozen=True)
class ResponseMeta:
    """What every body and chunk of one response repeats."""

    id: str
    created: int
    model: str
    weights_version: str  # also sent as system_fingerprint and the x-loom-weights-version header

    def head(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.weights_version,
        }


@dataclass
class Accumulated:
    """One request's result so far (the handler owns it; the engine never sees it)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    def add(self, out: RequestOutput) -> None:
        self.text.append(out.new_text)
        self.token_ids.extend(out.new_token_ids)
        self.logprobs.extend(out.logprobs)
        self.prompt_tokens = out.num_prompt_tokens
        self.cached_tokens = out.num_cached_tokens
        self.completion_tokens = out.num_output_tokens
        if out.finished:
            self.finish_reason = out.finish_reason

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def completion_logprobs(
    entries: Sequence[TokenLogprob], token_text: TokenText, offset: int = 0
) -> dict[str, Any]:
    """The legacy completions logprobs object; `offset` is the text length before entries[0]."""
    tokens = [token_text(e.token_id) for e in entries]
    offsets: list[int] = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{token_text(t): lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def _chat_token(token_id: int, logprob: float, token_text: TokenText) -> dict[str, Any]:
    text = token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: Sequence[TokenLogprob], token_text: TokenText) -> dict[str, Any]:
    content = []
    for e in entries:
        item = _chat_token(e.token_id, e.logprob, token_text)
        item["top_logprobs"] = [_chat_token(t, lp, token_text) for t, lp in e.top]
        content.append(item)
    return {"content": content}


def _add_token_ids(
    kind: Kind,
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
    kind: Kind,
    meta: ResponseMeta,
    acc: Accumulated,
    logprobs: dict[str, Any] | None,
    prompt_token_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """A non-streamed response; with `prompt_token_ids` (return_token_ids) also every id."""
    text = "".join(acc.text)
    choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": acc.finish_reason}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
        body = meta.head("chat.completion")
    else:
        choice["text"] = text
        body = meta.head("text_completion")
    body["choices"] = [choice]
    if prompt_token_ids is not None:
        _add_token_ids(kind, body, choice, acc.token_ids, prompt_token_ids)
    body["usage"] = acc.usage()
    return body


def chunk(
    kind: Kind,
    meta: ResponseMeta,
    text: str | None,
    logprobs: dict[str, Any] | None,
    finish_reason: str | None,
    with_usage_field: bool,
    role: bool = False,
    token_ids: Sequence[int] | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chunk. Chat chunks carry a delta; the first has the role. With
    return_token_ids every chunk has its new `token_ids` and the first the prompt's. `usage`
    (vLLM's continuous_usage_stats) is the usage so far; else `usage: null` when asked for."""
    choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
        body = meta.head("chat.completion.chunk")
    else:
        choice["text"] = text or ""
        body = meta.head("text_completion")
    body["choices"] = [choice]
    _add_token_ids(kind, body, choice, token_ids, prompt_token_ids)
    if usage is not None:
        body["usage"] = usage
    elif with_usage_field:
        body["usage"] = None
    return body


def usage_chunk(kind: Kind, meta: ResponseMeta, acc: Accumulated) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage is set: no choices, only usage."""
    body = meta.head("chat.completion.chunk" if kind == "chat" else "text_completion")
    body["choices"] = []
    body["usage"] = acc.usage()
    return body
