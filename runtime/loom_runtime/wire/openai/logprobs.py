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
    rank: int | None = None  # 1 + how many tokens were likelier (prompt log-probs fill it)


PromptLogprobs = Sequence[TokenLogprob | None]
"""One entry per prompt token; the first is None (no token precedes it)."""


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


def echo_completion_logprobs(
    prompt_ids: Sequence[int],
    prompt: PromptLogprobs,
    entries: Sequence[TokenLogprob],
    token_text: TokenText,
) -> dict[str, Any]:
    """The completions logprobs object of an echo: the prompt's tokens first (the first one's
    logprob and top_logprobs null), then the output's, offsets from the prompt text's start. A
    prompt token's top_logprobs hold itself and its alternatives, as vLLM answers them."""
    out = completion_logprobs(entries, token_text, 0)
    tokens = [token_text(t) for t in prompt_ids]
    offsets: list[int] = []
    at = 0
    for tok in tokens:
        offsets.append(at)
        at += len(tok)
    tops = [None if e is None else _with_itself(e, token_text) for e in prompt]
    return {
        "tokens": tokens + out["tokens"],
        "token_logprobs": [None if e is None else e.logprob for e in prompt]
        + out["token_logprobs"],
        "top_logprobs": tops + out["top_logprobs"],
        "text_offset": offsets + [at + o for o in out["text_offset"]],
    }


def _with_itself(entry: TokenLogprob, token_text: TokenText) -> dict[str, float]:
    top = {token_text(entry.token_id): entry.logprob}
    top.update((token_text(t), lp) for t, lp in entry.top)
    return top


def vllm_prompt_logprobs(prompt: PromptLogprobs, token_text: TokenText) -> list[Any]:
    """vLLM's `prompt_logprobs` of a choice: per prompt token null (the first) or a map from
    token id (a string) to {logprob, rank, decoded_token}: the token itself and its top
    alternatives."""
    out: list[Any] = []
    for e in prompt:
        if e is None:
            out.append(None)
            continue
        item = {str(e.token_id): _vllm_entry(e.logprob, e.rank, token_text(e.token_id))}
        for rank, (t, lp) in enumerate(e.top, 1):
            item.setdefault(str(t), _vllm_entry(lp, rank, token_text(t)))
        out.append(item)
    return out


def _vllm_entry(logprob: float, rank: int | None, text: str) -> dict[str, Any]:
    return {"logprob": logprob, "rank": rank, "decoded_token": text}
