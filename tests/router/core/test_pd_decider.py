from __future__ import annotations

from collections.abc import Callable

import pytest

from loom_router.core.endpoints import Endpoint
from loom_router.core.pd_decider import cached_tokens, decide

EndpointFactory = Callable[..., Endpoint]


@pytest.mark.parametrize(
    ("role", "prompt", "cached", "threshold", "prefill", "disaggregate", "says"),
    [
        ("decode", 4096, 0, 2048, True, True, "4096 uncached tokens >= minUncachedTokens 2048"),
        ("decode", 4096, 2048, 2048, True, True, "2048 uncached tokens >= minUncachedTokens"),
        ("decode", 4096, 2064, 2048, True, False, "2032 uncached tokens < minUncachedTokens"),
        ("decode", 100, 0, 2048, True, False, "decode prefills locally"),
        ("decode", 4096, 0, 2048, False, False, "no prefill endpoint can take it on weights"),
        ("decode", 10, 0, 0, True, True, "10 uncached tokens >= minUncachedTokens 0"),
        ("aggregated", 9999, 0, 16, True, False, "aggregated endpoint"),
        ("prefill", 9999, 0, 16, True, False, "cannot decode"),
    ],
)
def test_disaggregate_iff_enough_uncached_tokens_and_a_same_version_prefill(
    endpoint: EndpointFactory,
    role: str,
    prompt: int,
    cached: int,
    threshold: int,
    prefill: bool,
    disaggregate: bool,
    says: str,
) -> None:
    decision = decide(endpoint("x", role=role, version="v3"), prompt, cached, threshold, prefill)
    assert decision.disaggregate is disaggregate
    assert says in decision.reason
    assert decision.uncached_tokens == max(0, prompt - cached)
    if disaggregate or not prefill:
        assert "v3" in decision.reason


@pytest.mark.parametrize(
    ("matched", "block", "prompt", "expected"),
    [
        (6, 16, 140, 96),
        (10, 16, 140, 128),  # 140 tokens → at most 8 reusable full blocks
        (8, 16, 128, 112),  # the last token is always computed: 7 blocks
        (0, 16, 500, 0),
        (3, 16, 0, 0),
    ],
)
def test_cached_tokens_are_whole_blocks_short_of_the_last_token(
    matched: int, block: int, prompt: int, expected: int
) -> None:
    assert cached_tokens(matched, block, prompt) == expected
