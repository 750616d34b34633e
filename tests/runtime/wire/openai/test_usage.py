"""The usage object: totals and cached prompt tokens."""

from __future__ import annotations

import pytest

from loom_runtime.wire.openai.usage import usage


@pytest.mark.parametrize(
    ("prompt", "completion", "cached", "total"), [(0, 0, 0, 0), (40, 2, 32, 42), (1, 9, 0, 10)]
)
def test_usage_totals_and_cached_tokens(
    prompt: int, completion: int, cached: int, total: int
) -> None:
    assert usage(prompt, completion, cached) == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
