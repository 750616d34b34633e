"""The LSE merge: attention over any split of the rows, merged, equals attention over all of
them; a part that saw nothing (LSE −inf, NaN or +inf; output NaN) adds nothing."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_runtime.parallel.lse_merge import merge, merged_lse, rescale, sanitize

INF = float("inf")


def attention(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scores) @ values and logsumexp(scores): [Q, K], [K, D] -> [Q, D], [Q]."""
    return scores.softmax(dim=-1) @ values, scores.logsumexp(dim=-1)


@settings(max_examples=60, deadline=None)
@given(
    keys=st.integers(1, 40),
    parts=st.integers(1, 6),
    seed=st.integers(0, 10_000),
)
def test_merging_partial_attention_equals_attention_over_all_rows(
    keys: int, parts: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, keys, generator=gen, dtype=torch.float64) * 4
    values = torch.randn(keys, 5, generator=gen, dtype=torch.float64)
    owner = torch.randint(parts, (keys,), generator=gen)
    outs, lses = [], []
    for p in range(parts):
        mask = owner == p
        if mask.any():
            o, lse = attention(scores[:, mask], values[mask])
        else:  # an empty part: what a softmax over nothing gives
            o, lse = torch.full((3, 5), math.nan, dtype=torch.float64), torch.full((3,), -INF)
        outs.append(o)
        lses.append(lse.to(torch.float64))
    out, total = merge(torch.stack(outs), torch.stack(lses))
    expected, expected_lse = attention(scores, values)
    assert torch.allclose(out, expected, rtol=0, atol=1e-12)
    assert torch.allclose(total, expected_lse, rtol=0, atol=1e-12)


def test_nan_and_plus_inf_lses_count_as_minus_inf() -> None:
    lse = torch.tensor([1.0, math.nan, INF, -INF])
    assert torch.equal(sanitize(lse), torch.tensor([1.0, -INF, -INF, -INF]))
    outputs = torch.tensor([[[2.0]], [[math.nan]], [[7.0]]])  # [W=3, Q=1, D=1]
    lses = torch.tensor([[0.5], [math.nan], [INF]])
    out, total = merge(outputs, lses)
    assert torch.equal(out, torch.tensor([[2.0]]))  # only the first part counts
    assert torch.equal(total, torch.tensor([0.5]))


def test_when_every_part_is_empty_the_output_is_zero_and_the_lse_minus_inf() -> None:
    lses = torch.full((2, 4), -INF)
    assert torch.equal(merged_lse(lses), torch.full((4,), -INF))
    out, _ = merge(torch.full((2, 4, 3), math.nan), lses)
    assert torch.equal(out, torch.zeros(4, 3))


def test_rescale_weights_a_part_by_its_share_of_the_total() -> None:
    out = rescale(torch.ones(1, 2), torch.tensor([math.log(1.0)]), torch.tensor([math.log(4.0)]))
    assert torch.allclose(out, torch.full((1, 2), 0.25))
