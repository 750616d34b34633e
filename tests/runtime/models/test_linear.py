"""The batch-invariant matmul: a row's result is the same bits whatever rows share the call
(their number, its position among them), in float32 and float64, and equals torch's own
matmul to rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loom_runtime.models.linear import INVARIANT_ROWS, invariant_linear, plain_linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_a_rows_result_is_the_same_bits_whoever_shares_the_call(
    dtype: torch.dtype, bias: bool
) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 40, generator=gen, dtype=dtype)
    b = torch.randn(96, generator=gen, dtype=dtype) if bias else None
    x = torch.randn(3 * INVARIANT_ROWS + 5, 40, generator=gen, dtype=dtype)
    alone = invariant_linear(x[:1], weight, b)[0]
    for n in (1, 2, INVARIANT_ROWS - 1, INVARIANT_ROWS, INVARIANT_ROWS + 1, len(x)):
        for at in {0, n // 2, n - 1}:
            rows = x[:n].clone()
            rows[at] = x[0]
            assert torch.equal(invariant_linear(rows, weight, b)[at], alone), (n, at)
    torch.testing.assert_close(invariant_linear(x, weight, b), F.linear(x, weight, b))


def test_it_keeps_the_leading_shape_and_equals_the_plain_form() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    weight = torch.randn(24, 16, generator=gen, dtype=torch.float64)
    out = invariant_linear(x, weight, None)
    assert out.shape == (2, 5, 24)
    torch.testing.assert_close(out, plain_linear(x, weight, None), rtol=0, atol=1e-12)
