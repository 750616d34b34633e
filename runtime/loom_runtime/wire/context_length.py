"""THE context-length rule: whether a prompt and its max_tokens fit a model's context, and how
many tokens a request may generate; shared by the worker and the router (before a P/D hop).

Owns the rule and its error messages; never tokenizes and never reads a request body.
"""

from __future__ import annotations

from loom_runtime.errors import InvalidRequestError

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def resolve_max_tokens(
    requested: int | None, default: int | None, prompt_len: int, max_model_len: int, param: str
) -> int:
    """max_tokens to run with; InvalidRequestError when prompt + output cannot fit the context.

    `default` None means "the rest of the context" (chat); a default larger than the room left
    is clamped, an explicit value is not. `param` names the prompt's field in the error.
    """
    room = max_model_len - prompt_len
    if room < 1:
        raise InvalidRequestError(
            f"this model's maximum context length is {max_model_len} tokens, but the "
            f"prompt has {prompt_len}; shorten the prompt",
            param=param,
        )
    if requested is None:
        return room if default is None else min(default, room)
    if requested > room:
        raise InvalidRequestError(
            f"this model's maximum context length is {max_model_len} tokens, but "
            f"{prompt_len} prompt tokens + max_tokens {requested} = {prompt_len + requested}; "
            f"lower max_tokens to at most {room} or shorten the prompt",
            param="max_tokens",
        )
    return requested
