"""The two tiers of Hybrid HiSparse decode: every token's rows in a host pool (a whole latent
cache: latent + RoPE rows and indexer keys, what P/D moves), a copy of the indexer keys on the
device, and per request a device hot buffer of recently selected rows.

Owns the tiers' memory, the copies between them and their byte counts; never selects rows or
decides which block belongs to whom (the indexer and the block pool do).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from loom_runtime.kv.fp8 import pack, pack_mla, unpack
from loom_runtime.kv.hot_buffer import HotBuffer
from loom_runtime.kv.latent_cache import LatentKVCache, LatentKVCacheSpec


def default_hot_slots(index_topk: int) -> int:
    """REFERENCE.md §A: twice the top-k, plus one slot for the newest token."""
    return 2 * index_topk + 1


@dataclass(frozen=True)
class HiSparseSpec:
    """A latent cache in two tiers. Block b of `latent` exists in both: the host tier holds all
    of it (latent + RoPE rows and indexer key rows, `latent`'s own layout, so P/D pulls land
    there), the device its indexer key rows again (what decode selection reads). `hot_slots`
    rows per layer per request sit on the device in a hot buffer; at most `max_requests` such
    buffers at once."""

    latent: LatentKVCacheSpec
    hot_slots: int
    max_requests: int

    def __post_init__(self) -> None:
        if self.hot_slots < 1 or self.max_requests < 1:
            raise ValueError(
                f"HiSparseSpec needs hot_slots >= 1 and max_requests >= 1, got "
                f"{self.hot_slots} and {self.max_requests}"
            )

    @property
    def block_size(self) -> int:
        return self.latent.block_size

    @property
    def num_blocks(self) -> int:
        return self.latent.num_blocks

    @property
    def host_spec(self) -> LatentKVCacheSpec:
        """The host tier: the whole latent cache (its keys too: the P/D layout moves them)."""
        return self.latent

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's stored latent + RoPE row in one layer: what a miss moves."""
        s = self.latent
        return s.stored_row_width * s.storage_dtype.itemsize

    @property
    def index_row_bytes(self) -> int:
        """Bytes of one token's stored indexer key row in one layer."""
        s = self.latent
        return s.stored_index_width * s.storage_dtype.itemsize

    @property
    def host_bytes_per_block(self) -> int:
        """Host bytes one block costs: latent + RoPE rows and indexer key rows."""
        return self.host_spec.bytes_per_block

    @property
    def device_bytes_per_block(self) -> int:
        """Device bytes one block costs: its indexer key rows only."""
        s = self.latent
        return s.block_size * len(s.index_layers) * self.index_row_bytes

    @property
    def bytes_per_block(self) -> int:
        """Device bytes per block (the KVSpec figure the engine sizes device memory with)."""
        return self.device_bytes_per_block

    @property
    def hot_bytes_per_request(self) -> int:
        """Device bytes of one request's hot buffers (decoded rows, every layer)."""
        s = self.latent
        return s.num_layers * self.hot_slots * s.row_width * s.dtype.itemsize

    @property
    def device_bytes(self) -> int:
        """Device memory of the whole cache: every block's keys, every hot buffer."""
        return (
            self.num_blocks * self.device_bytes_per_block
            + self.max_requests * self.hot_bytes_per_request
        )

    def allocate(self, device: torch.device | str = "cpu") -> HiSparseKVCache:
        return HiSparseKVCache(self, device)


def plan_hisparse(
    latent: LatentKVCacheSpec,
    host_pool_bytes: int,
    hot_slots: int,
    max_requests: int,
    min_blocks: int,
    num_blocks: int | None = None,
    device_budget: int | None = None,
) -> HiSparseSpec:
    """The tiers for `latent`'s shape: as many blocks as the host pool holds (or `num_blocks`,
    which it must hold), at least `min_blocks` (one request of the longest length); ValueError
    if that is not possible or the device part exceeds `device_budget` bytes."""
    one = HiSparseSpec(replace(latent, num_blocks=1), hot_slots, max_requests)
    fits = host_pool_bytes // one.host_bytes_per_block
    blocks = fits if num_blocks is None else num_blocks
    if blocks > fits:
        raise ValueError(
            f"HiSparse: {blocks} blocks of {one.host_bytes_per_block} host bytes do not fit a "
            f"host pool of {host_pool_bytes} bytes (it holds {fits}); grow the pool"
        )
    if blocks < min_blocks:
        raise ValueError(
            f"HiSparse: a host pool of {host_pool_bytes} bytes holds {blocks} blocks, fewer "
            f"than one request of the longest length needs ({min_blocks}); grow the pool or "
            "lower max_model_len"
        )
    spec = HiSparseSpec(replace(latent, num_blocks=blocks), hot_slots, max_requests)
    if device_budget is not None and spec.device_bytes > device_budget:
        raise ValueError(
            f"HiSparse: {blocks} blocks' indexer keys and {max_requests} hot buffers need "
            f"{spec.device_bytes} device bytes, over the budget of {device_budget}; lower "
            "max_num_seqs, the hot slots or the host pool"
        )
    return spec


@dataclass
class TierCounters:
    """Cumulative counts of the tiers' work (since construction)."""

    hits: int = 0  # selected rows a decode found in its hot buffer
    misses: int = 0  # selected rows a decode copied in from the host tier
    resident: int = 0  # selected rows computed in the same step (already on the device)
    h2d_bytes: int = 0  # bytes of those misses' host -> device copies
    keys_h2d_bytes: int = 0  # pulled or reloaded blocks' indexer keys copied host -> device
    prefill_h2d_bytes: int = 0  # bytes of prefill chunks' temporary host -> device gathers
    d2h_bytes: int = 0  # bytes of new rows (and their indexer keys) written to the host tier


class HotRows:
    """One request's hot buffers: per layer a slot map and its `slots` decoded rows."""

    def __init__(
        self,
        layers: int,
        slots: int,
        latent_dim: int,
        rope_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.maps = [HotBuffer(slots) for _ in range(layers)]
        self.latent = torch.zeros(layers, slots, latent_dim, dtype=dtype, device=device)
        self.rope = torch.zeros(layers, slots, rope_dim, dtype=dtype, device=device)

    @classmethod
    def of(cls, spec: HiSparseSpec, device: torch.device | str) -> HotRows:
        s = spec.latent
        return cls(s.num_layers, spec.hot_slots, s.latent_dim, s.rope_dim, s.dtype, device)

    @property
    def nbytes(self) -> int:
        return self.latent.nbytes + self.rope.nbytes


class HiSparseKVCache:
    """`host` holds every block whole (a LatentKVCache of the latent spec on the host device:
    what the P/D connector binds); `data` is the device tier, [num_blocks, block elements] of
    indexer key rows (the KVStore's tensor). Every write stores the keys in both tiers, so the
    host copy is always a valid latent cache; keys that arrive in the host tier by a pull or an
    offload reload are copied to the device by `keys_arrived`. Hot buffers are created per
    request id and released by the engine."""

    transferable = True  # P/D moves `host` (the connector's LatentLayout of the latent spec)

    def __init__(
        self,
        spec: HiSparseSpec,
        device: torch.device | str = "cpu",
        host_device: torch.device | str = "cpu",
    ) -> None:
        self.spec = spec
        s = spec.latent
        self.device = torch.device(device)
        pinned = self.device.type == "cuda" and torch.device(host_device).type == "cpu"
        self.host = LatentKVCache(spec.host_spec, host_device, pin_memory=pinned)
        self.data = torch.zeros(
            s.num_blocks,
            len(s.index_layers) * s.block_size * s.stored_index_width,
            dtype=s.storage_dtype,
            device=self.device,
        )
        self.index_rows = self.data.view(
            s.num_blocks, len(s.index_layers), s.block_size, s.stored_index_width
        )
        self._index_slot = {layer: slot for slot, layer in enumerate(s.index_layers)}
        self._hot: dict[str, HotRows] = {}
        self.counters = TierCounters()

    # --- the device tier: indexer keys -------------------------------------------------------

    def has_index_keys(self, layer: int) -> bool:
        return layer in self._index_slot

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> None:
        """New tokens' rows at flat slots: every row to the host tier, the keys on the device
        too (the host keys keep the tier a whole latent cache, for a P/D prefill to serve)."""
        slot = self._index_slot.get(layer)
        if slot is not None and index_keys is None:
            raise ValueError(f"layer {layer} runs its own indexer: write needs its index keys")
        host, s = self.host.data.device, self.spec.latent
        host_keys = None if slot is None or index_keys is None else index_keys.to(host)
        self.host.write(layer, slots.to(host), latent.to(host), rope_keys.to(host), host_keys)
        row = self.spec.row_bytes + (0 if host_keys is None else self.spec.index_row_bytes)
        self.counters.d2h_bytes += int(slots.shape[0]) * row
        if slot is None or index_keys is None:
            return
        keys = index_keys.to(s.dtype) if s.fp8 is None else pack(index_keys, s.fp8)
        bs = s.block_size
        self.index_rows[slots // bs, slot, slots % bs] = keys

    def as_stored(
        self, latent: torch.Tensor, rope: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """New rows as a host read returns them once written (rounded through fp8 if packed),
        so a row read this step equals the same row fetched in a later one."""
        s = self.spec.latent
        if s.fp8 is None:
            return latent.to(s.dtype), rope.to(s.dtype)
        return self.host.decode_rows(pack_mla(latent, rope, s.fp8))

    def load_blocks(self, source: LatentKVCache, blocks: torch.Tensor) -> None:
        """Copy `blocks` (int64 [N]) of an all-on-device latent cache of the same spec (a
        prefill's, or a transfer's landing buffer) into the tiers: whole blocks to the host,
        their keys here too."""
        if source.spec != self.spec.latent:
            raise ValueError("load_blocks needs a latent cache of this cache's spec")
        host = self.host.data.device
        whole = source.data.index_select(0, blocks).to(host)
        self.host.data.index_copy_(0, blocks.to(host), whole)
        self.counters.d2h_bytes += whole.nbytes
        self.index_rows.index_copy_(0, blocks, source.index_rows.index_select(0, blocks))

    def keys_arrived(self, blocks: list[int]) -> None:
        """A P/D pull or a CPU KV offload reload wrote these blocks into the host tier: copy
        their indexer key rows host -> device (the selection reads the device copy). Counted in
        `keys_h2d_bytes`."""
        if not blocks or not self._index_slot:
            return
        ids = torch.tensor(blocks, dtype=torch.long)
        keys = self.host.index_rows.index_select(0, ids.to(self.host.data.device))
        arrived = keys.to(self.device)  # the host -> device copy
        self.index_rows.index_copy_(0, ids.to(self.device), arrived)
        self.counters.keys_h2d_bytes += arrived.nbytes

    def index_keys(self, layer: int, blocks: torch.Tensor) -> torch.Tensor | None:
        """Index keys [N * block_size, index_dim] of `blocks` in `layer`, or None on a
        shared-indexer layer (device tier only)."""
        slot = self._index_slot.get(layer)
        if slot is None:
            return None
        s = self.spec.latent
        keys = self.index_rows[:, slot].index_select(0, blocks).reshape(-1, s.stored_index_width)
        return keys if s.fp8 is None else unpack(keys, s.index_dim, s.fp8).to(s.dtype)

    # --- the host tier and the hot buffers ---------------------------------------------------

    def hot_rows(self, request_id: str) -> HotRows:
        """The request's hot buffers, created empty on first use (bounded by max_requests)."""
        hot = self._hot.get(request_id)
        if hot is None:
            if len(self._hot) >= self.spec.max_requests:
                raise ValueError(
                    f"request {request_id!r}: {len(self._hot)} hot buffers in use, the most "
                    f"this cache holds ({self.spec.max_requests}); release finished requests'"
                )
            hot = self._hot[request_id] = HotRows.of(self.spec, self.device)
        return hot

    def release(self, request_id: str) -> None:
        """Drop a finished, aborted or preempted request's hot buffers (no-op if none)."""
        self._hot.pop(request_id, None)

    @property
    def hot_requests(self) -> int:
        return len(self._hot)

    def fetch_selected(
        self, hot: HotRows, layer: int, positions: list[int], slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (latent, RoPE), in the order of `positions`, of a decode's selected earlier
        tokens (at host flat `slots`): hits are read from the hot buffer, misses are copied
        from the host tier into it first (only those rows cross)."""
        res = hot.maps[layer].resolve(positions)
        if res.misses:
            at = {p: i for i, p in enumerate(res.positions)}
            host = self.host.data.device
            pick = torch.tensor([at[p] for p, _ in res.misses], dtype=torch.long)
            stored = self.host.stored_rows(layer, slots.to(host).index_select(0, pick.to(host)))
            arrived = stored.to(self.device)  # the host -> device copy
            latent, rope = self.host.decode_rows(arrived)
            into = torch.tensor([s for _, s in res.misses], dtype=torch.long, device=self.device)
            hot.latent[layer].index_copy_(0, into, latent)
            hot.rope[layer].index_copy_(0, into, rope)
            self.counters.h2d_bytes += arrived.nbytes
        self.counters.hits += res.hits
        self.counters.misses += len(res.misses)
        read = torch.tensor(res.slots, dtype=torch.long, device=self.device)
        return hot.latent[layer].index_select(0, read), hot.rope[layer].index_select(0, read)

    def place_new(
        self, hot: HotRows, layer: int, position: int, latent: torch.Tensor, rope: torch.Tensor
    ) -> None:
        """Keep a row computed on the device this step ([latent_dim], [rope_dim]) in the hot
        buffer as the most recent one: the next step finds the newest token there."""
        slot = hot.maps[layer].place(position)
        hot.latent[layer, slot] = latent
        hot.rope[layer, slot] = rope

    def fetch_temporary(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows at host flat `slots` copied to the device for this step only (a prefill
        chunk's selections are too wide for a hot buffer)."""
        stored = self.host.stored_rows(layer, slots.to(self.host.data.device))
        arrived = stored.to(self.device)
        self.counters.prefill_h2d_bytes += arrived.nbytes
        return self.host.decode_rows(arrived)
