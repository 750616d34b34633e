"""each_element: an elementwise function's result for a row is the same bits whatever rows
share the call (torch's own CPU kernels run a tensor's tail by another path), and is the
function's value."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from loom_runtime.models.elementwise import each_element


@pytest.mark.parametrize("fn", [torch.sigmoid, torch.exp, torch.cos, torch.sin])
@pytest.mark.parametrize("width", [4, 8, 13, 64])
def test_a_row_is_the_same_bits_in_any_batch(
    fn: Callable[[torch.Tensor], torch.Tensor], width: int
) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, width, generator=g) * 4
    alone = [each_element(fn, x[i : i + 1]) for i in range(9)]
    for rows in range(1, 10):
        together = each_element(fn, x[:rows])
        for i in range(rows):
            assert torch.equal(together[i : i + 1], alone[i]), (rows, i)
    torch.testing.assert_close(torch.cat(alone), fn(x), atol=1e-6, rtol=1e-6)
