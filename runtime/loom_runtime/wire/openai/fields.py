"""The OpenAI request values both the worker and the router judge: the limits of counts and
token ids, the prompt, stop strings and message content, with the words of their errors.

Owns the rules and the messages (ValueError, the caller adds the field path); never parses a
whole body (request.py does, for the worker; the router checks only what it routes on).
"""

from __future__ import annotations

from loom_runtime.wire.prompt import join_text_parts

MAX_LOGPROBS = 20  # top alternatives per token, as vLLM allows
MAX_STOP_SEQUENCES = 16
MAX_STOP_TOKEN_IDS = 256
MAX_MESSAGES = 4096
MAX_PROMPTS = 256  # prompts in one /v1/completions request (one choice each)
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # torch.long, as vLLM bounds `seed`
INT_MAX = 2**31 - 1  # ceiling of every count and token-id field (the vocabulary comes later)

NO_MESSAGES = "at least one message is required"
MAX_BIAS = 100.0  # |logit_bias| ceiling, as OpenAI


def required(param: str) -> str:
    """The message for a missing required field."""
    return f"{param} is required"


def prompt_value(value: object) -> tuple[str | tuple[int, ...], ...]:
    """A completion prompt: a string or token ids, or a list of them (one choice each)."""
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        if len(value) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts in one request, got {len(value)}")
        return tuple(_one_prompt(v, f" (prompt {i})" if len(value) > 1 else "")
                     for i, v in enumerate(value))  # fmt: skip
    return (_one_prompt(value, ""),)


def _one_prompt(value: object, where: str) -> str | tuple[int, ...]:
    if isinstance(value, str):
        if not value:
            raise ValueError(f"prompt is empty{where}")
        return value
    if isinstance(value, list):
        if not value:
            raise ValueError(f"prompt is empty{where}")
        for i, t in enumerate(value):
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t <= INT_MAX:
                raise ValueError(
                    f"a token-id prompt must be a list of non-negative integers (item {i} is "
                    f"{shown(t)}){where}"
                )
        return tuple(value)
    raise ValueError("prompt must be a string or a list of token ids, or a list of them")


def shown(value: object) -> str:
    """`value` as an error message quotes it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def stop_value(value: object) -> tuple[str, ...]:
    """`stop`: none, a non-empty string, or a list of them."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise ValueError("stop must be a non-empty string or a list of non-empty strings")
    if len(items) > MAX_STOP_SEQUENCES:
        raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(items)}")
    return tuple(items)


def message_content(value: object) -> str:
    """Message content: a string, or a list of text parts that is joined into one."""
    return join_text_parts(value)


def optional_content(value: object) -> str | None:
    """Message content that may be null (an assistant message that only made calls)."""
    return None if value is None else join_text_parts(value)


def logit_bias_value(value: dict[str, float]) -> dict[str, float]:
    """`logit_bias`: token ids written in decimal, each with a bias in [-100, 100] (OpenAI's
    rules; the vocabulary is checked at the engine's door)."""
    for key, bias in value.items():
        if not key.isdecimal() or str(int(key)) != key or int(key) > INT_MAX:
            raise ValueError(f"keys must be token ids written in decimal, got {shown(key)}")
        if not -MAX_BIAS <= bias <= MAX_BIAS:
            raise ValueError(f"the bias of token {key} must be in [-100, 100], got {bias}")
    return value
