"""The OpenAI `usage` object.

Owns its fields and their order; never counts tokens (the engine does).
"""

from __future__ import annotations

from typing import Any


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """`usage` as completions and chat answer it (cached tokens in prompt_tokens_details)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
