"""The HiSparse tiers: a whole latent block lives on the host (rows and indexer keys: the layout
P/D moves) and only its indexer keys on the device, both tiers' keys agree after writes, loads and
pulls, a decode's selected rows come back as written, only misses cross host -> device and are
counted in stored bytes (packed fp8 too), hot buffers are bounded per request, and the planner
sizes blocks from the host pool."""

from __future__ import annotations

import pytest
import torch

from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import (
    HiSparseKVCache,
    HiSparseSpec,
    default_hot_slots,
    plan_hisparse,
)
from loom_runtime.kv.latent_cache import LatentKVCache, LatentKVCacheSpec

LATENT = LatentKVCacheSpec(
    num_layers=4,
    latent_dim=32,
    rope_dim=8,
    index_layers=(0, 2),
    index_dim=16,
    block_size=16,
    num_blocks=6,
    dtype=torch.float64,
)


def filled(spec: LatentKVCacheSpec, hot_slots: int = 8) -> tuple[HiSparseKVCache, LatentKVCache]:
    """A HiSparse cache and an all-on-device one with the same random rows in blocks 0..5."""
    hs = HiSparseSpec(spec, hot_slots=hot_slots, max_requests=2).allocate()
    dev = spec.allocate()
    gen = torch.Generator().manual_seed(0)
    slots = torch.arange(spec.num_blocks * spec.block_size)
    for layer in range(spec.num_layers):
        n = slots.shape[0]
        lat = torch.randn(n, spec.latent_dim, generator=gen, dtype=torch.float64)
        rope = torch.randn(n, spec.rope_dim, generator=gen, dtype=torch.float64)
        keys = torch.randn(n, spec.index_dim, generator=gen, dtype=torch.float64)
        hs.write(layer, slots, lat, rope, keys)
        dev.write(layer, slots, lat, rope, keys)
    return hs, dev


def test_the_host_tier_is_a_whole_latent_block_and_the_device_holds_its_keys() -> None:
    spec = HiSparseSpec(LATENT, hot_slots=default_hot_slots(64), max_requests=3)
    assert spec.hot_slots == 129
    assert spec.host_bytes_per_block == 16 * 4 * 40 * 8 + 16 * 2 * 16 * 8
    assert spec.host_bytes_per_block == LATENT.bytes_per_block and spec.host_spec == LATENT
    assert spec.device_bytes_per_block == spec.bytes_per_block == 16 * 2 * 16 * 8
    assert spec.hot_bytes_per_request == 4 * 129 * 40 * 8
    cache = spec.allocate()
    assert cache.data.nbytes == 6 * spec.device_bytes_per_block
    assert cache.host.data.nbytes == 6 * spec.host_bytes_per_block
    assert cache.host.data.data_ptr() != cache.data.data_ptr()
    assert spec.device_bytes == cache.data.nbytes + 3 * spec.hot_bytes_per_request


def test_selected_rows_come_back_as_written_and_only_misses_are_copied() -> None:
    hs, dev = filled(LATENT)
    blocks = torch.arange(6)
    for layer in (0, 2):
        keys, want = hs.index_keys(layer, blocks), dev.gather(layer, blocks)[2]
        assert keys is not None and want is not None and torch.equal(keys, want)
    assert hs.index_keys(1, blocks) is None
    hot = hs.hot_rows("r")
    positions = [3, 70, 17, 90]
    slots = torch.tensor(positions)  # one table 0..5: position p is slot p
    lat, rope = hs.fetch_selected(hot, 1, positions, slots)
    want_lat, want_rope, _ = dev.gather(1, blocks)
    assert torch.equal(lat, want_lat[slots]) and torch.equal(rope, want_rope[slots])
    c = hs.counters
    assert (c.hits, c.misses, c.h2d_bytes) == (0, 4, 4 * 40 * 8)
    lat2, _ = hs.fetch_selected(hot, 1, [90, 3, 5], torch.tensor([90, 3, 5]))
    assert torch.equal(lat2, want_lat[[90, 3, 5]])
    assert (c.hits, c.misses, c.h2d_bytes) == (2, 5, 5 * 40 * 8)
    hs.place_new(hot, 1, 95, want_lat[95], want_rope[95])  # a device row: nothing crosses
    assert c.h2d_bytes == 5 * 40 * 8 and hot.maps[1].slot_of(95) is not None


def test_fp8_rows_cross_packed_and_decode_like_the_device_cache() -> None:
    spec = LatentKVCacheSpec(**{**LATENT.__dict__, "fp8": Fp8Format(16)})
    hs, dev = filled(spec)
    positions = [1, 33, 64]
    lat, rope = hs.fetch_selected(hs.hot_rows("r"), 3, positions, torch.tensor(positions))
    want_lat, want_rope, _ = dev.gather(3, torch.arange(6))
    assert torch.equal(lat, want_lat[positions]) and torch.equal(rope, want_rope[positions])
    packed = 32 + 2 * 4 + 8 * 2  # e4m3 latent, two fp32 scales, BF16 RoPE
    assert hs.spec.row_bytes == packed and hs.counters.h2d_bytes == 3 * packed
    new_lat, new_rope = hs.as_stored(want_lat[:2].clone(), want_rope[:2].clone())
    assert torch.equal(new_lat, want_lat[:2]) and torch.equal(new_rope, want_rope[:2])


def test_load_blocks_copies_a_device_cache_into_the_tiers() -> None:
    _, dev = filled(LATENT)
    hs = HiSparseSpec(LATENT, hot_slots=4, max_requests=1).allocate()
    hs.load_blocks(dev, torch.tensor([4, 1]))
    assert torch.equal(hs.host.data[4], dev.data[4]) and torch.equal(hs.host.data[1], dev.data[1])
    assert torch.equal(hs.index_rows[1], dev.index_rows[1])
    assert hs.host.rows[0].abs().sum() == 0
    assert hs.counters.d2h_bytes == 2 * hs.spec.host_bytes_per_block


@pytest.mark.parametrize("fp8", [None, Fp8Format(16)])
def test_writes_keep_the_host_tier_a_whole_latent_cache(fp8: Fp8Format | None) -> None:
    """Every write stores the keys in both tiers: the host tier's bytes equal an all-on-device
    cache's (what a HiSparse prefill serves over P/D), packed fp8 included."""
    spec = LatentKVCacheSpec(**{**LATENT.__dict__, "fp8": fp8})
    hs, dev = filled(spec)
    assert torch.equal(hs.host.data, dev.data)
    assert torch.equal(hs.index_rows, hs.host.index_rows.to(hs.device))
    per_token = 4 * hs.spec.row_bytes + 2 * hs.spec.index_row_bytes
    assert hs.counters.d2h_bytes == 6 * 16 * per_token


@pytest.mark.parametrize("fp8", [None, Fp8Format(16)])
def test_keys_arrived_copies_pulled_blocks_keys_to_the_device(fp8: Fp8Format | None) -> None:
    """A pull writes whole blocks into the host tier (as stored bytes); `keys_arrived` copies
    just those blocks' key rows to the device, so selection reads the pulled keys."""
    spec = LatentKVCacheSpec(**{**LATENT.__dict__, "fp8": fp8})
    _, dev = filled(spec)
    hs = HiSparseSpec(spec, hot_slots=4, max_requests=1).allocate()
    hs.host.data[[2, 5]] = dev.data[[2, 5]]  # what the connector's pull does
    assert hs.index_keys(0, torch.tensor([2])).abs().sum() == 0  # type: ignore[union-attr]
    hs.keys_arrived([2, 5])
    for layer in (0, 2):
        keys, want = (
            hs.index_keys(layer, torch.tensor([5, 2])),
            dev.gather(layer, torch.tensor([5, 2]))[2],
        )
        assert keys is not None and want is not None and torch.equal(keys, want)
    assert hs.index_rows[[0, 1, 3, 4]].abs().sum() == 0  # other blocks untouched
    assert hs.counters.keys_h2d_bytes == 2 * hs.spec.device_bytes_per_block
    hs.keys_arrived([])
    assert hs.counters.keys_h2d_bytes == 2 * hs.spec.device_bytes_per_block


def test_hot_buffers_are_bounded_and_released() -> None:
    hs = HiSparseSpec(LATENT, hot_slots=4, max_requests=2).allocate()
    assert hs.hot_rows("a") is hs.hot_rows("a")
    hs.hot_rows("b")
    with pytest.raises(ValueError, match="release finished requests"):
        hs.hot_rows("c")
    hs.release("a")
    hs.release("never-there")
    hs.hot_rows("c")
    assert hs.hot_requests == 2


def test_plan_sizes_blocks_from_the_host_pool_within_the_device_budget() -> None:
    host_block = HiSparseSpec(LATENT, 9, 2).host_bytes_per_block
    spec = plan_hisparse(LATENT, 10 * host_block + 5, hot_slots=9, max_requests=2, min_blocks=4)
    assert spec.num_blocks == 10 and spec.device_bytes < 10 * LATENT.bytes_per_block
    with pytest.raises(ValueError, match="fewer than one request"):
        plan_hisparse(LATENT, 3 * host_block, hot_slots=9, max_requests=2, min_blocks=4)
    with pytest.raises(ValueError, match="do not fit a host pool"):
        plan_hisparse(LATENT, 3 * host_block, 9, 2, min_blocks=1, num_blocks=5)
    with pytest.raises(ValueError, match="over the budget"):
        plan_hisparse(LATENT, 10 * host_block, 9, 2, min_blocks=1, device_budget=1000)
