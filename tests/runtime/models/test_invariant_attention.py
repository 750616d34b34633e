"""Batch-invariant attention: a query's output equals torch's attention (to rounding in float32,
1e-12 in float64) and is the same bits whatever else is computed with it — the other queries of
its chunk, the chunk it falls in, keys past its own, the part of a long prompt it is scored in."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loom_runtime.models import invariant_attention as module
from loom_runtime.models.invariant_attention import (
    KEY_TILE,
    DecodeTiles,
    invariant_attention,
    invariant_decode,
)

HEADS, KV_HEADS, DIM, LENGTH = 4, 2, 16, 150  # 150 keys: three tiles, the last one partial


def sequence(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(LENGTH, HEADS, DIM, generator=g, dtype=dtype)
    k = torch.randn(LENGTH, KV_HEADS, DIM, generator=g, dtype=dtype)
    v = torch.randn(LENGTH, KV_HEADS, DIM, generator=g, dtype=dtype)
    return q, k, v


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Queries start.. of the sequence over keys 0..their own (keys past them passed too)."""
    last = torch.arange(start, start + q.shape[0])
    return invariant_attention(q, k, v, last, DIM**-0.5)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_it_is_attention(dtype: torch.dtype, tol: float) -> None:
    q, k, v = sequence(dtype)
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        is_causal=True, scale=DIM**-0.5, enable_gqa=True,
    )[0].transpose(0, 1)  # fmt: skip
    torch.testing.assert_close(causal(q, k, v), expected, atol=tol, rtol=tol)


def test_a_query_is_the_same_bits_in_any_chunk_with_any_keys_after_it() -> None:
    q, k, v = sequence(torch.float32)
    whole = causal(q, k, v)
    for size in (1, 5, 16, 63, 64, 97):
        for start in range(0, LENGTH, size):
            end = min(start + size, LENGTH)
            # as a chunked prefill sees them: keys up to the chunk's last (the cache's rows)
            got = causal(q[start:end], k[:end], v[:end], start)
            assert torch.equal(got, whole[start:end]), (size, start)
    alone = causal(q[70:71], k[:71], v[:71], 70)  # a decode step over its context
    assert torch.equal(alone, whole[70:71])
    assert torch.equal(causal(q[70:71], k, v, 70), alone)  # keys past its own add nothing


def test_queries_of_a_tile_do_not_touch_each_other() -> None:
    q, k, v = sequence(torch.float32)
    rows = torch.tensor([3, 70, 149, 10, 64, 65, 128, 7, 100])  # any order, more than a tile
    together = invariant_attention(q[rows], k, v, rows, DIM**-0.5)
    for i, row in enumerate(rows.tolist()):
        alone = invariant_attention(q[row : row + 1], k, v, rows[i : i + 1], DIM**-0.5)
        assert torch.equal(together[i : i + 1], alone), row


def test_a_long_prompt_scored_in_parts_is_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = sequence(torch.float32)
    whole = causal(q, k, v)
    monkeypatch.setattr(module, "SCORE_CHUNK_BYTES", 1)  # one query tile per part
    assert torch.equal(causal(q, k, v), whole)
    assert KEY_TILE < LENGTH  # the key tiles are summed, not one GEMM


def test_decodes_of_many_sequences_in_one_call_are_each_the_same_bits() -> None:
    q, k, v = sequence(torch.float32)
    whole = causal(q, k, v)
    lengths = [1, 64, 65, 150, 30]  # sequence j: the first lengths[j] keys of the sequence
    keys = torch.cat([k[:n] for n in lengths])
    values = torch.cat([v[:n] for n in lengths])
    starts = [sum(lengths[:j]) for j in range(len(lengths))]
    queries = torch.stack([q[n - 1] for n in lengths])
    tiles = DecodeTiles.of(list(zip(starts, lengths, strict=True)), keys.device)
    got = invariant_decode(queries, keys, values, tiles, DIM**-0.5)
    for j, n in enumerate(lengths):
        assert torch.equal(got[j], whole[n - 1]), n
