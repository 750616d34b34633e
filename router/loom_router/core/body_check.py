"""The checks of the body fields the router itself reads: the prompt (or messages) it tokenizes
and hashes, and the context length it decides before a P/D hop.

Owns refusing, with a 400 naming the field, a body the router cannot route; never checks the
sampling fields (the worker, which defines them, does) and never changes a body: what passes is
sent on unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from loom_router.errors import BadRequestError
from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire import pd
from loom_runtime.wire.context_length import COMPLETIONS_DEFAULT_MAX_TOKENS, resolve_max_tokens
from loom_runtime.wire.openai.fields import (
    INT_MAX,
    NO_MESSAGES,
    message_content,
    prompt_value,
    required,
)
from loom_runtime.wire.openai.response import ResponseKind

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_body(raw: bytes) -> dict[str, Any]:
    """A request body as the worker would read it: UTF-8 JSON, an object, no lone surrogate."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequestError(
            f"the request body is not UTF-8 (invalid byte at offset {exc.start})"
        ) from None
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise BadRequestError(f"the request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(body):
        raise BadRequestError(
            "the request body is not valid JSON (a lone surrogate in a \\u escape)"
        )
    return body


def _has_lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def check_body(kind: ResponseKind, body: Mapping[str, Any]) -> None:
    """BadRequestError (with its param) when the prompt or messages cannot be routed."""
    if kind == "completion":
        _check_prompt(body.get("prompt"), "prompt" in body)
    else:
        _check_messages(body.get("messages"), "messages" in body)


def prefilled_where_decoded(kind: str, body: Mapping[str, Any]) -> bool:
    """Whether a body must skip the remote prefill: a completions body with several prompts, or
    either kind asking for prompt log-probs (loom_runtime.wire.pd.prefilled_where_decoded)."""
    return pd.prefilled_where_decoded(body)


def _check_prompt(prompt: object, present: bool) -> None:
    """The worker's prompt rule (loom_runtime.wire.openai.fields), as a 400 on `prompt`."""
    if not present:
        raise BadRequestError(required("prompt"), param="prompt")
    try:
        prompt_value(prompt)
    except ValueError as exc:
        raise BadRequestError(f"prompt: {exc}", param="prompt") from None


def _check_messages(messages: object, present: bool) -> None:
    if not present:
        raise BadRequestError(required("messages"), param="messages")
    if not isinstance(messages, list):
        raise BadRequestError("messages: Input should be a valid array", param="messages")
    if not messages:
        raise BadRequestError(f"messages: {NO_MESSAGES}", param="messages")
    for i, message in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise BadRequestError(f"{at}: Input should be an object", param=at)
        if not isinstance(message.get("role"), str):
            raise BadRequestError(f"{at}.role: the role must be a string", param=f"{at}.role")
        try:
            message_content(message.get("content"))
        except ValueError as exc:
            raise BadRequestError(f"{at}.content: {exc}", param=f"{at}.content") from None


def requested_max_tokens(kind: ResponseKind, body: Mapping[str, Any]) -> int | None:
    """The client's output budget when it is a positive int (else the worker judges it)."""
    keys = ("max_tokens",) if kind == "completion" else ("max_completion_tokens", "max_tokens")
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def check_context(
    kind: ResponseKind, body: Mapping[str, Any], prompt_len: int, max_model_len: int
) -> None:
    """BadRequestError when the prompt and its max_tokens cannot fit `max_model_len`: the rule
    the worker applies (loom_runtime.wire.context_length), decided before any P/D hop."""
    default = COMPLETIONS_DEFAULT_MAX_TOKENS if kind == "completion" else None
    param = "prompt" if kind == "completion" else "messages"
    try:
        resolve_max_tokens(
            requested_max_tokens(kind, body), default, prompt_len, max_model_len, param
        )
    except InvalidRequestError as exc:
        raise BadRequestError(str(exc), param=exc.param) from None


def check_rewritten_fields(body: Mapping[str, Any]) -> None:
    """BadRequestError when a field the P/D prefill step rewrites or drops (loom_runtime.wire.pd)
    is one the decode would refuse: the prefill cannot see it, so without this check it would
    hold KV for a decode that never comes."""
    for key in ("stream", "return_token_ids"):
        if key in body and not isinstance(body[key], bool):
            raise BadRequestError(f"{key}: Input should be a valid boolean", param=key)
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= INT_MAX
        ):
            raise BadRequestError(
                f"{key}: Input should be an integer in 1..{INT_MAX}, got {repr(value)[:40]}",
                param=key,
            )
    min_tokens = body.get("min_tokens")
    budget = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(min_tokens, int) and isinstance(budget, int) and min_tokens > budget:
        # The prefill step runs with max_tokens 1 and would hold KV for a decode that refuses.
        raise BadRequestError(
            f"min_tokens ({min_tokens}) must be at most max_tokens ({budget})", param="min_tokens"
        )
    options = body.get("stream_options")
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise BadRequestError("stream_options: Input should be an object", param="stream_options")
    for key in ("include_usage", "continuous_usage_stats"):
        if key in options and not isinstance(options[key], bool):
            param = f"stream_options.{key}"
            raise BadRequestError(f"{param}: Input should be a valid boolean", param=param)
    if body.get("stream") is not True:
        raise BadRequestError(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
