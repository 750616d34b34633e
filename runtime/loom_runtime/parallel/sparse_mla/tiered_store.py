"""TieredStore: where a rank of a Hybrid HiSparse decode (the reference decode: DP × EP ranks,
docs/hisparse.md) keeps one sequence: every row in the host tier (the sequence's cache, in host
memory), its indexer keys again on the device (what selection scores), and per layer a device
hot buffer of recently selected rows; attention reads only the rows a step selected.

Owns one sequence's tiers and the copies between them, counted in the rank's TierCounters;
never selects or attends (parallel/sparse_mla/tiered_hooks.py does).
"""

from __future__ import annotations

import torch

from loom_runtime.kv.fp8 import Fp8Format, pack, unpack
from loom_runtime.kv.hisparse_cache import HotRows, TierCounters
from loom_runtime.models.sparse_mla.cache import GROW_ROWS, LayerRows, grown, grown_rows
from loom_runtime.parallel.sparse_mla.store import FullStore, HeldRows, SequenceCache, as_stored


class DeviceKeys:
    """One sequence's indexer keys on the device: per full indexer layer a [rows, width] run,
    packed fp8 when the KV is, allocated as the sequence grows (as its host cache is)."""

    def __init__(
        self,
        layers: int,
        dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
        fp8: Fp8Format | None,
    ) -> None:
        self.dim, self.capacity, self.dtype, self.fp8 = dim, capacity, dtype, fp8
        width = dim if fp8 is None else fp8.row_bytes(dim)
        stored = dtype if fp8 is None else torch.uint8
        self.rows = torch.zeros(
            layers, min(capacity, GROW_ROWS), width, dtype=stored, device=device
        )

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's key row in one index layer."""
        return int(self.rows.shape[2]) * self.rows.element_size()

    @property
    def bytes_per_token(self) -> int:
        return self.rows.shape[0] * self.row_bytes

    def write(self, slot: int, start: int, keys: torch.Tensor, kept: int) -> None:
        """Keys of tokens start.. of index layer `slot`; the first `kept` rows survive a grow."""
        end = start + int(keys.shape[0])
        allocate = grown_rows(self.rows.shape[1], end, self.capacity)
        if allocate != self.rows.shape[1]:
            self.rows = grown(self.rows, allocate, kept)
        self.rows[slot, start:end] = keys if self.fp8 is None else pack(keys, self.fp8)

    def read(self, slot: int, end: int) -> torch.Tensor:
        """Keys [end, dim] of tokens 0..end-1 of index layer `slot`, in the model's dtype."""
        keys = self.rows[slot, :end]
        return keys if self.fp8 is None else unpack(keys, self.dim, self.fp8).to(self.dtype)


class TieredStore(FullStore):
    """Every row of the sequence on this rank (a DP replica's, or EP alone: no PCP, no DCP),
    in two tiers. `keep` hands a forward its new rows and the whole context's device keys, not
    the context's rows: `fetch_hot` (a one-token forward) and `fetch_temporary` (a wider one)
    bring in only what was selected."""

    def __init__(
        self,
        cache: SequenceCache,
        keys: DeviceKeys,
        hot: HotRows,
        counters: TierCounters,
        fp8: Fp8Format | None = None,
    ) -> None:
        super().__init__(cache, fp8)
        self.keys = keys
        self.hot = hot
        self.counters = counters  # the rank's, shared by its sequences
        self.device = keys.rows.device

    @property
    def visible(self) -> int:
        """Tokens the current forward sees (its own included)."""
        return self.cache.length + self._new

    def keep(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
        sharded: bool,
    ) -> LayerRows:
        """Write the new rows to the host tier (their keys to the device too); the forward's
        new rows as stored, and every key of the context on a full indexer layer."""
        latent, rope_keys, index_keys = as_stored(self.fp8, latent, rope_keys, index_keys)
        start, n = self.cache.length, int(latent.shape[0])
        host = self.cache.device
        slot = self.cache.index_slot(layer)
        host_keys = None if slot is None or index_keys is None else index_keys.to(host)
        self.cache.store(layer, latent.to(host), rope_keys.to(host), host_keys)
        self.counters.d2h_bytes += n * self.cache.row_bytes
        keys = None
        if slot is not None and index_keys is not None:
            self.counters.d2h_bytes += n * self.keys.row_bytes
            self.keys.write(slot, start, index_keys, start)
            keys = self.keys.read(slot, start + n)
        return LayerRows(latent=latent, rope_keys=rope_keys, index_keys=keys)

    def fetch_hot(self, layer: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (latent, RoPE) of cached tokens `positions` (sorted) for a one-token forward:
        hits read from the hot buffer, misses copied in from the host tier first."""
        hot = self.hot
        res = hot.maps[layer].resolve(positions.tolist())
        if res.misses:
            host = self.cache.device
            at = torch.tensor([p for p, _ in res.misses], dtype=torch.long, device=host)
            latent, rope = self.cache.rows_at(layer, at)
            into = torch.tensor([s for _, s in res.misses], dtype=torch.long, device=self.device)
            hot.latent[layer].index_copy_(0, into, latent.to(self.device))
            hot.rope[layer].index_copy_(0, into, rope.to(self.device))
            self.counters.h2d_bytes += len(res.misses) * self.cache.row_bytes
        self.counters.hits += res.hits
        self.counters.misses += len(res.misses)
        read = torch.tensor(res.slots, dtype=torch.long, device=self.device)
        return hot.latent[layer].index_select(0, read), hot.rope[layer].index_select(0, read)

    def place_new(
        self, layer: int, position: int, latent: torch.Tensor, rope: torch.Tensor
    ) -> None:
        """Keep the row a one-token forward computed ([latent_dim], [rope_dim]) in the hot
        buffer as its most recent: the next step finds the newest token there."""
        slot = self.hot.maps[layer].place(position)
        self.hot.latent[layer, slot] = latent
        self.hot.rope[layer, slot] = rope

    def fetch_temporary(
        self, layer: int, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of cached tokens `positions` copied to the device for this forward only (a
        prompt chunk's or a verify's selections are too wide for the hot buffer)."""
        latent, rope = self.cache.rows_at(layer, positions.to(self.cache.device))
        self.counters.prefill_h2d_bytes += int(positions.numel()) * self.cache.row_bytes
        return latent.to(self.device), rope.to(self.device)

    def truncate(self, length: int) -> None:
        """The sequence ends at token `length`; hot rows of later positions are forgotten (a
        rejected draft's row there is rewritten by a later forward)."""
        super().truncate(length)
        for buffer in self.hot.maps:
            buffer.forget_from(length)

    def seed(self, rows: HeldRows) -> None:
        """Start from a cached prefix: every row to the host tier, its keys to the device."""
        super().seed(rows)
        n = int(rows.positions.shape[0])
        for slot in range(rows.index_keys.shape[0]):
            keys = rows.index_keys[slot].to(self.device, self.keys.dtype)
            self.keys.write(slot, 0, keys, 0)
            self.counters.keys_h2d_bytes += n * self.keys.row_bytes

    def device_bytes(self, block_size: int) -> int:
        """Device bytes the sequence costs: its keys in whole blocks, and its hot buffers."""
        blocks = -(-self.kv_tokens // block_size)
        return blocks * block_size * self.keys.bytes_per_token + self.hot.nbytes
