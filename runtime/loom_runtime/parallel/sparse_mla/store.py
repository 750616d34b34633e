"""Where one rank keeps a sequence's rows: FullStore (a whole copy: one rank, or PCP, which
all-gathers every layer's new rows) or ShardStore (DCP: only the tokens this rank owns, by the
interleaved layout of dcp_shard.py), and the temporary full copy a prefill attends over.

Owns the rows, the sequence length and the KV accounting, and hands out copies of the rows a
rank holds (a P/D prefill's export); never selects or attends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loom_runtime.kv.fp8 import Fp8Format, pack, pack_mla, unpack, unpack_mla
from loom_runtime.models.sparse_mla.cache import LayerRows, SparseMlaCache
from loom_runtime.parallel.collectives import Comm, all_gather_rows
from loom_runtime.parallel.dcp_shard import ShardMap
from loom_runtime.parallel.sparse_mla.packed_cache import PackedCache


@dataclass(frozen=True)
class HeldRows:
    """A rank's rows of some of a sequence's tokens, as its cache holds them: `positions` [n]
    (global, ascending), then per layer latent [layers, n, latent_dim], RoPE keys [layers, n,
    rope_dim] and the full indexer layers' keys [index layers, n, index_dim] (copies)."""

    positions: torch.Tensor
    latent: torch.Tensor
    rope_keys: torch.Tensor
    index_keys: torch.Tensor

    @classmethod
    def of(cls, cache: SequenceCache, positions: torch.Tensor, first: int, last: int) -> HeldRows:
        """The rows in local slots first..last-1 of `cache`, which hold tokens `positions`."""
        latent, rope, keys = cache.rows_between(first, last)
        return cls(positions=positions.cpu(), latent=latent, rope_keys=rope, index_keys=keys)


def as_stored(
    fp8: Fp8Format | None,
    latent: torch.Tensor,
    rope_keys: torch.Tensor,
    index_keys: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """New rows as an fp8 paged cache gives them back once written (kv/fp8.py: e4m3 latent and
    index keys with group scales, BF16 RoPE), in their own dtype; as they are without fp8. A
    rank attends over these, so its numerics are the one-rank fp8 engine's; the rounding is
    idempotent, so the engine's pool re-packs them to the same bytes."""
    if fp8 is None:
        return latent, rope_keys, index_keys
    lat, rope = unpack_mla(
        pack_mla(latent, rope_keys, fp8), latent.shape[-1], rope_keys.shape[-1], fp8
    )
    keys = None
    if index_keys is not None:
        keys = unpack(pack(index_keys, fp8), index_keys.shape[-1], fp8).to(index_keys.dtype)
    return lat.to(latent.dtype), rope.to(rope_keys.dtype), keys


def _seed(cache: SequenceCache, rows: HeldRows, keep: slice | torch.Tensor) -> None:
    """Write rows[keep] of every layer at the empty cache's start and commit them."""
    if cache.length:
        raise ValueError(f"seed a new sequence, not one of {cache.length} tokens")
    index = iter(range(rows.index_keys.shape[0]))
    n = 0
    for layer in range(rows.latent.shape[0]):
        device = cache.device
        latent = rows.latent[layer][keep].to(device)
        keys = rows.index_keys[next(index)][keep].to(device) if cache.has_index(layer) else None
        cache.write(layer, latent, rows.rope_keys[layer][keep].to(device), keys)
        n = int(latent.shape[0])
    cache.advance(n)


SequenceCache = SparseMlaCache | PackedCache
"""Where a rank keeps one sequence's rows: as computed, or packed fp8 (fp8 KV)."""


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class FullStore:
    """Every row of the sequence on this rank."""

    def __init__(self, cache: SequenceCache, fp8: Fp8Format | None = None) -> None:
        self.cache = cache
        self.fp8 = fp8  # rows rounded through this format before they are kept
        self._new = 0

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def kv_tokens(self) -> int:
        return self.cache.length

    @property
    def bytes_per_token(self) -> int:
        return self.cache.bytes_per_token

    def begin(self, new: int) -> None:
        self.cache.check_room(new)
        self._new = new

    def keep(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
        sharded: bool,
    ) -> LayerRows:
        latent, rope_keys, index_keys = as_stored(self.fp8, latent, rope_keys, index_keys)
        return self.cache.write(layer, latent, rope_keys, index_keys)

    def advance(self) -> None:
        self.cache.advance(self._new)
        self._new = 0

    def block_bytes(self, block_size: int) -> int:
        return _blocks(self.kv_tokens, block_size) * block_size * self.bytes_per_token

    def truncate(self, length: int) -> None:
        """The sequence ends at token `length` (rejected drafts' rows dropped; their memory is
        reused by the next forward)."""
        self.cache.truncate(length)

    def seed(self, rows: HeldRows) -> None:
        """Start the sequence from a cached prefix: rows of tokens 0..n-1, every one kept."""
        _seed(self.cache, rows, slice(None))

    def rows_between(self, start: int, end: int) -> HeldRows:
        """Every row of tokens start..end-1 (all are here)."""
        positions = torch.arange(start, end, device=self.cache.device)
        return HeldRows.of(self.cache, positions, start, end)


class ShardStore:
    """This DCP rank's tokens only: its cache rows are the owned tokens in position order."""

    def __init__(
        self, cache: SequenceCache, shard: ShardMap, comm: Comm, fp8: Fp8Format | None = None
    ) -> None:
        if comm.size != shard.world or comm.index != shard.rank:
            raise ValueError(f"shard {shard} does not match its DCP group {comm.ranks}")
        self.cache = cache
        self.fp8 = fp8  # rows rounded through this format before they are kept
        self.shard = shard
        self.comm = comm
        self.length = 0  # the whole sequence's, over every rank
        self._new = 0
        self._own = torch.zeros(0, dtype=torch.long)
        self._prior: list[torch.Tensor] = []
        self._keys_at = torch.zeros(0, dtype=torch.long)

    @property
    def kv_tokens(self) -> int:
        return self.cache.length

    @property
    def bytes_per_token(self) -> int:
        return self.cache.bytes_per_token

    @property
    def visible(self) -> int:
        """Tokens of the whole sequence the current forward sees (its own included)."""
        return self.length + self._new

    @property
    def key_positions(self) -> torch.Tensor:
        """Global positions of this rank's rows once the current forward's are kept."""
        return self._keys_at

    def begin(self, new: int) -> None:
        """Before a forward of `new` tokens: which of them are this rank's."""
        shard, device = self.shard, self.cache.device
        fresh = torch.arange(self.length, self.length + new, device=device)
        self._own = torch.where((fresh // shard.interleave) % shard.world == shard.rank)[0]
        self.cache.check_room(int(self._own.shape[0]))
        self._new = new
        self._keys_at = _slot_positions(shard, shard.local_length(self.length + new), device)
        self._prior = [
            _slot_positions(s, s.local_length(self.length), device)
            for s in (ShardMap(shard.world, shard.interleave, r) for r in range(shard.world))
        ]

    def keep(
        self,
        layer: int,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
        sharded: bool,
    ) -> LayerRows:
        """Store the owned new rows; the rows to attend over: this rank's shard (`sharded`)
        or a temporary full copy, the other ranks' earlier rows gathered (prefill)."""
        latent, rope_keys, index_keys = as_stored(self.fp8, latent, rope_keys, index_keys)
        own = self._own
        keys = None if index_keys is None else index_keys[own]
        rows = self.cache.write(layer, latent[own], rope_keys[own], keys)
        if sharded:
            return rows
        return self._full_copy(rows, latent, rope_keys, index_keys)

    def advance(self) -> None:
        self.cache.advance(int(self._own.shape[0]))
        self.length += self._new
        self._new = 0

    def block_bytes(self, block_size: int) -> int:
        """Bytes of the KV blocks this rank's rows fill (the last one partly)."""
        return _blocks(self.kv_tokens, block_size) * block_size * self.bytes_per_token

    def truncate(self, length: int) -> None:
        """The sequence ends at token `length`: this rank keeps the rows it owns before it."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a {self.length}-token sequence to {length}")
        self.cache.truncate(self.shard.local_length(length))
        self.length = length

    def seed(self, rows: HeldRows) -> None:
        """Start the sequence from a cached prefix (rows of tokens 0..n-1): the owned ones."""
        if self.length:
            raise ValueError(f"seed a new sequence, not one of {self.length} tokens")
        p = rows.positions
        own = torch.where((p // self.shard.interleave) % self.shard.world == self.shard.rank)[0]
        _seed(self.cache, rows, own)
        self.length = int(p.shape[0])

    def rows_between(self, start: int, end: int) -> HeldRows:
        """The rows of tokens start..end-1 this rank owns (the others are on its peers)."""
        first, last = self.shard.local_length(start), self.shard.local_length(end)
        device = self.cache.device
        positions = _slot_positions(self.shard, last, device)[first:]
        return HeldRows.of(self.cache, positions, first, last)

    def _full_copy(
        self,
        rows: LayerRows,
        latent: torch.Tensor,
        rope_keys: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> LayerRows:
        new = [latent, rope_keys] + ([] if index_keys is None else [index_keys])
        if self.length == 0:
            return LayerRows(latent=latent, rope_keys=rope_keys, index_keys=index_keys)
        mine = self.shard.local_length(self.length)
        local = [rows.latent[:mine], rows.rope_keys[:mine]]
        if rows.index_keys is not None and index_keys is not None:
            local.append(rows.index_keys[:mine])
        widths = [t.shape[1] for t in local]
        counts = [int(p.shape[0]) for p in self._prior]
        parts = all_gather_rows(self.comm, torch.cat(local, dim=1), counts)
        prior = parts[0].new_empty((self.length, sum(widths)))
        for positions, part in zip(self._prior, parts, strict=True):
            prior[positions] = part
        whole = torch.split(torch.cat((prior, torch.cat(new, dim=1)), dim=0), widths, dim=1)
        return LayerRows(
            latent=whole[0],
            rope_keys=whole[1],
            index_keys=whole[2] if len(whole) > 2 else None,
        )


def _slot_positions(shard: ShardMap, slots: int, device: torch.device) -> torch.Tensor:
    """Global positions of a shard's first `slots` rows (dcp_shard.global_position)."""
    s = torch.arange(slots, device=device)
    i, w = shard.interleave, shard.world
    return (s // i) * w * i + shard.rank * i + s % i


def shard_capacity(capacity: int, shard: ShardMap, block_size: int) -> int:
    """Rows a shard needs for a sequence of up to `capacity` tokens, in whole blocks."""
    return _blocks(shard.local_length(capacity), block_size) * block_size
