"""The seams the parallel forward hooks into: attention over parts of the selected rows merged
by log-sum-exp equals attention over all of them; the indexer scores a shard of the keys as it
scores those keys among all of them, up to float32 rounding, and the shards' pooled best k are
the global top-k; and
the trunk-then-head split of the forward changes nothing."""

from __future__ import annotations

import torch

from loom_runtime.models.sparse_mla.cache import LayerRows
from loom_runtime.models.sparse_mla.indexer import Selection, top_k
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.models.sparse_mla.rotary import pair_tables
from loom_runtime.parallel.lse_merge import merge

T, L = 5, 300


def _inputs(ours: LoadedSparseMla, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    c = ours.config
    h = torch.randn(L, c.hidden_size, generator=gen, dtype=torch.float64)
    q_resid = torch.randn(L, c.q_lora_rank, generator=gen, dtype=torch.float64)
    return h, q_resid, torch.arange(L)


def test_partial_attention_over_a_split_merges_into_the_whole(ours: LoadedSparseMla) -> None:
    c = ours.config
    attention = ours.model.layers[1].attention
    h, _, positions = _inputs(ours, 1)
    rope = pair_tables(positions, c.qk_rope_head_dim, c.rope_theta, torch.float64)
    latent, rope_keys = attention.latent(h, rope)
    rows = LayerRows(latent=latent, rope_keys=rope_keys, index_keys=None)
    q = attention.queries(
        h[-T:], pair_tables(positions[-T:], c.qk_rope_head_dim, c.rope_theta, torch.float64)
    )
    gen = torch.Generator().manual_seed(2)
    indices = torch.stack([torch.randperm(L, generator=gen)[: c.index_topk] for _ in range(T)])
    valid = torch.ones_like(indices, dtype=torch.bool)
    valid[0, 10:] = False  # a query with fewer real rows
    whole = attention.attend(q, rows, Selection(indices, valid))
    parts = []
    for owner in range(3):  # rows split over 3 "ranks" by position, one of them empty for query 0
        mine = valid & (indices % 3 == owner) & ~((owner == 2) & (torch.arange(T) == 0))[:, None]
        parts.append(attention.partial(q, rows, Selection(indices, mine)))
    merged, _ = merge(torch.stack([p.latent for p in parts]), torch.stack([p.lse for p in parts]))
    dropped = valid.clone()
    dropped[0] &= indices[0] % 3 != 2
    expected = attention.attend(q, rows, Selection(indices, dropped))
    assert torch.allclose(attention.project(merged), expected, rtol=0, atol=1e-12)
    assert not torch.allclose(whole[0], expected[0], rtol=0, atol=1e-6)  # dropping rows shows


def test_the_indexer_scores_a_shard_as_among_all_keys_and_picks_the_global_top_k(
    ours: LoadedSparseMla,
) -> None:
    """Equal up to float32 GEMM rounding (a GEMM over fewer keys may round a score one ulp
    apart: BLAS picks its kernels by shape), and the shards' pooled best k are the whole's."""
    c = ours.config
    indexer = ours.model.layers[0].indexer
    assert indexer is not None
    h, q_resid, positions = _inputs(ours, 3)
    rope = pair_tables(positions, c.qk_rope_head_dim, c.rope_theta, torch.float64)
    keys = indexer.keys(h, rope)
    for queries in (slice(L - 1, L), slice(0, L)):  # a decode step, a prefill
        q_rope = pair_tables(positions[queries], c.qk_rope_head_dim, c.rope_theta, torch.float64)
        args = (h[queries], q_resid[queries], q_rope)
        whole = indexer.scores(*args, keys, positions[queries])
        expected = top_k(whole, c.index_topk)
        for world, interleave in ((2, 1), (2, 4), (3, 16)):
            pooled_scores, pooled_positions = [], []
            for rank in range(world):
                shard = torch.where((positions // interleave) % world == rank)[0]
                part = indexer.scores(*args, keys[shard], positions[queries], shard)
                assert torch.allclose(part, whole[:, shard], rtol=1e-6, atol=1e-6)
                local = top_k(part, c.index_topk)
                pooled_scores.append(part.gather(1, local.indices))
                pooled_positions.append(shard[local.indices])
            scores, where = torch.cat(pooled_scores, 1), torch.cat(pooled_positions, 1)
            order = where.sort(dim=1, stable=True).indices  # ties: the earlier position
            scores, where = scores.gather(1, order), where.gather(1, order)
            best = scores.sort(dim=1, descending=True, stable=True).indices[:, : c.index_topk]
            chosen = where.gather(1, best)
            assert torch.equal(chosen[expected.valid], expected.indices[expected.valid])


def test_trunk_then_head_is_the_forward(ours: LoadedSparseMla) -> None:
    from loom_runtime.models.sparse_mla.hooks import LocalHooks

    ids = torch.arange(40)
    expected = ours.model.forward(ids, ours.model.new_cache(40))
    cache = ours.model.new_cache(40)
    hidden = ours.model.hidden_states(ids, torch.arange(40), LocalHooks(cache))
    assert torch.equal(ours.model.logits(hidden), expected)
