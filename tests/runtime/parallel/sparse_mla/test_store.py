"""A DCP ShardStore keeps exactly its tokens' rows, in position order, over forwards of any
size; its key positions name them; FullStore keeps everything. (No collectives: the rows of
each forward are offered to every shard, as the ranks of a DCP group all see them.)"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loom_runtime.models.sparse_mla.cache import SparseMlaCache
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.parallel.collectives import Comm
from loom_runtime.parallel.dcp_shard import ShardMap
from loom_runtime.parallel.sparse_mla.store import ShardStore, shard_capacity


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    world=st.sampled_from([2, 3, 4]),
    interleave=st.sampled_from([1, 4, 16]),
)
def test_each_shard_keeps_its_own_rows_in_order(
    ours: LoadedSparseMla, steps: list[int], world: int, interleave: int
) -> None:
    c = ours.config
    total = sum(steps)
    latent = torch.randn(total, c.kv_lora_rank, dtype=torch.float64)
    rope = torch.randn(total, c.qk_rope_head_dim, dtype=torch.float64)
    keys = torch.randn(total, c.index_head_dim, dtype=torch.float64)
    group = tuple(range(world))
    stores = []
    for rank in range(world):
        shard = ShardMap(world, interleave, rank)
        cache = SparseMlaCache(c, shard_capacity(total, shard, 16), torch.float64)
        stores.append(ShardStore(cache, shard, Comm(ranks=group, index=rank)))
    start = 0
    for new in steps:
        for store in stores:
            store.begin(new)
            rows = [
                store.keep(
                    layer,
                    latent[start : start + new],
                    rope[start : start + new],
                    keys[start : start + new],
                    sharded=True,
                )
                for layer in range(c.num_hidden_layers)
            ]
            owned = store.key_positions
            assert torch.equal(rows[0].latent, latent[owned])
            assert rows[0].index_keys is not None and torch.equal(rows[0].index_keys, keys[owned])
            assert rows[1].index_keys is None  # a shared-indexer layer keeps no keys
            store.advance()
        start += new
    for rank, store in enumerate(stores):
        expected = [t for t in range(total) if (t // interleave) % world == rank]
        assert store.key_positions.tolist() == expected
        assert store.kv_tokens == len(expected) and store.length == total
