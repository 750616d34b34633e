"""The prompt in a completions choice: echo (its text, and with logprobs its tokens' log-probs,
before the output's) and vLLM's prompt_logprobs, from what the engine computed in the prefill.

Owns which parts of a choice an echo replaces; never computes a log-prob and never does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loom_runtime.serve.responses import Accumulated
from loom_runtime.wire.openai.logprobs import (
    TokenText,
    echo_completion_logprobs,
    vllm_prompt_logprobs,
)
from loom_runtime.wire.openai.request import CompletionRequest


@dataclass(frozen=True)
class PromptEcho:
    """What one completions choice shows of its prompt."""

    prompt_text: str  # the prompt as sent (token ids: decoded)
    prompt_ids: tuple[int, ...]
    echo: bool
    alone: bool  # echo with max_tokens 0: the prompt without the token run after it
    logprobs: bool  # the client asked for logprobs
    prompt_logprobs: bool  # the client asked for vLLM's prompt_logprobs

    @property
    def wanted(self) -> bool:
        return self.echo or self.prompt_logprobs


def prompt_echo(
    req: CompletionRequest, prompt: str | tuple[int, ...], ids: tuple[int, ...], decode: TokenText
) -> PromptEcho:
    """The echo of one of `req`'s prompts (`prompt` as sent, `ids` its tokens);
    `decode(ids)` is the text of token ids."""
    text = prompt if isinstance(prompt, str) else "".join(decode(t) for t in ids)
    return PromptEcho(
        prompt_text=text,
        prompt_ids=ids,
        echo=req.echo,
        alone=req.echo and req.max_tokens == 0,
        logprobs=req.logprobs is not None,
        prompt_logprobs=req.prompt_logprobs is not None,
    )


def echo_stream_fields(
    echo: PromptEcho, acc: Accumulated, token_text: TokenText
) -> tuple[str, dict[str, Any] | None, dict[str, Any]]:
    """What a streamed choice's first chunk shows of its prompt: the text, the logprobs object
    of the prompt's tokens (None when not asked for) and extra choice fields (prompt_logprobs).
    Later chunks' text offsets continue after the text."""
    prompt = acc.prompt_logprobs
    text = echo.prompt_text if echo.echo else ""
    logprobs = None
    if echo.echo and echo.logprobs:
        logprobs = echo_completion_logprobs(echo.prompt_ids, prompt, (), token_text)
    extra = {"prompt_logprobs": vllm_prompt_logprobs(prompt, token_text)} if (
        echo.prompt_logprobs
    ) else {}  # fmt: skip
    return text, logprobs, extra


def echo_choice(
    choice: dict[str, Any], echo: PromptEcho, acc: Accumulated, token_text: TokenText
) -> dict[str, Any]:
    """`choice` (a non-streamed completions choice) with its prompt shown as `echo` says; the
    usage's completion tokens are the caller's to drop when `echo.alone`."""
    out = dict(choice)
    prompt = acc.prompt_logprobs
    if echo.echo:
        entries = () if echo.alone else acc.logprobs
        out["text"] = echo.prompt_text + ("" if echo.alone else choice["text"])
        if echo.logprobs:
            out["logprobs"] = echo_completion_logprobs(echo.prompt_ids, prompt, entries, token_text)
        if echo.alone:
            out.pop("token_ids", None)
    if echo.prompt_logprobs:
        out["prompt_logprobs"] = vllm_prompt_logprobs(prompt, token_text)
    return out
