"""The two OpenAI logprobs shapes: completions' parallel lists and chat's per-token content.

Owns the keys and their order; never computes a logprob and never decodes a token itself (the
caller passes token texts, or a function from id to text).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

TokenText = Callable[[int], str]
COMPLETION_FIELDS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
"""The lists of a completions logprobs object, one entry per token, in this order."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's logprob and its top alternatives (the engine's sampler fills it)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


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


def chat_token(text: str, logprob: float) -> dict[str, Any]:
    """One token of chat logprobs: its text, logprob and UTF-8 bytes."""
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_entry(text: str, logprob: float, top: Iterable[tuple[str, float]]) -> dict[str, Any]:
    """One `content` entry of chat logprobs: the token and its top alternatives."""
    item = chat_token(text, logprob)
    item["top_logprobs"] = [chat_token(t, lp) for t, lp in top]
    return item


def chat_logprobs(entries: Sequence[TokenLogprob], token_text: TokenText) -> dict[str, Any]:
    """The chat logprobs object of `entries`."""
    content = [
        chat_entry(token_text(e.token_id), e.logprob, [(token_text(t), lp) for t, lp in e.top])
        for e in entries
    ]
    return {"content": content}
