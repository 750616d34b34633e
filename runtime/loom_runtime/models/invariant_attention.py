"""Attention whose every query's result is the same bits however it is computed: alone or in a
batch, in a whole prompt or a chunk of it, from fresh keys or a prefix cache, as a prefill row
or a decode step (the engine's batch-invariant mode; models/linear.py does the matmuls).

torch's fused attention picks its blocking by the query and key counts, so a query's output
moves in its last bits with the chunk it was computed in. Here every product is one GEMM of a
fixed shape: a tile of QUERY_ROWS queries (padded with zeros) against a tile of KEY_TILE keys
that starts at a multiple of KEY_TILE in the sequence. A query's softmax weights and weighted
values are summed tile by tile in key order; the tiles past its last key add exact zeros, so its
result depends on its own keys alone.

Owns that computation; never reads the cache (the caller passes a sequence's keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

QUERY_ROWS = 8
"""Queries per GEMM tile."""
KEY_TILE = 64
"""Keys per GEMM tile, from position 0 of the sequence."""
SCORE_CHUNK_BYTES = 64 << 20
"""A part of a long prompt's query tiles, with its scores and copies of the keys, stays within
this many bytes (a long prompt is attended in parts)."""


def invariant_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    last_key: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [n, heads, D] over one sequence's keys and values [L, kv_heads, D] (positions
    0..L-1), query i seeing keys 0..last_key[i] -> [n, heads, D] in q's dtype."""
    n, heads, dim = q.shape
    kv_heads = keys.shape[1]
    pad = -n % QUERY_ROWS
    tiles = _query_tiles(F.pad(q, (0, 0, 0, 0, 0, pad)).view(-1, QUERY_ROWS, heads, dim), kv_heads)
    last = F.pad(last_key, (0, pad), value=-1).view(-1, QUERY_ROWS)  # a pad row sees nothing
    k_all, v_all = (_key_tiles(x.to(q.dtype)) for x in (keys, values))
    outs = []
    for at, end, width in _parts(last, kv_heads * (tiles.shape[2] + 2 * dim) * KEY_TILE * 8):
        shape = (-1, end - at, -1, -1, -1)
        k, v = k_all[:, None, :width].expand(shape), v_all[:, None, :width].expand(shape)
        outs.append(_attend(tiles[:, at:end], k, v, last[at:end], scale))
    return _query_rows(torch.cat(outs, dim=1), heads)[:n]


def _parts(last: torch.Tensor, tile_pair_bytes: int) -> list[tuple[int, int, int]]:
    """Runs of consecutive query tiles that need the same number of key tiles (up to their
    queries' last key: a causal prompt's first tiles need fewer), each run's scores and copies
    of the keys within SCORE_CHUNK_BYTES: (first tile, end, key tiles). Which tiles a query is
    computed with changes nothing in it: the tiles past its last key add zeros."""
    needed = ((last.max(dim=1).values + KEY_TILE) // KEY_TILE).clamp(min=1).tolist()
    parts: list[tuple[int, int, int]] = []
    at = 0
    while at < len(needed):
        width = needed[at]
        step = max(1, SCORE_CHUNK_BYTES // (tile_pair_bytes * width))
        end = at + 1
        while end < len(needed) and end - at < step and needed[end] == width:
            end += 1
        parts.append((at, end, width))
        at = end
    return parts


@dataclass(frozen=True)
class DecodeTiles:
    """Where each of a decode group's sequences sits in its key tiles: sequence j's keys
    keys[at : at + length] for (at, length) = spans[j] go to rows j × width.. of the tiles
    (the rest zeros), its one query seeing them all. Built once per forward, read by every
    layer."""

    src: torch.Tensor  # int64 [sum of lengths]: key rows, sequence by sequence
    dst: torch.Tensor  # int64 [sum of lengths]: where each goes among [B × width] tile rows
    width: int  # keys per sequence in the tiles: the longest, rounded up to KEY_TILE
    last: torch.Tensor  # int64 [B, QUERY_ROWS]: each tile's last keys (its pad rows: -1)

    @classmethod
    def of(cls, spans: Sequence[tuple[int, int]], device: torch.device) -> DecodeTiles:
        width = max(-(-length // KEY_TILE) for _, length in spans) * KEY_TILE
        src = torch.cat([torch.arange(at, at + n) for at, n in spans])
        dst = torch.cat([torch.arange(j * width, j * width + n) for j, (_, n) in enumerate(spans)])
        last = torch.full((len(spans), QUERY_ROWS), -1, dtype=torch.long)
        last[:, 0] = torch.tensor([n - 1 for _, n in spans])
        return cls(src.to(device), dst.to(device), width, last.to(device))


def invariant_decode(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    tiles: DecodeTiles,
    scale: float,
) -> torch.Tensor:
    """One query per sequence (q [B, heads, D]) at its sequence's last key, the sequences' keys
    and values packed in `keys`/`values` [N, kv_heads, D] as `tiles` says -> [B, heads, D]: each
    query the same bits as `invariant_attention` gives it, every sequence in one call."""
    batch, heads, dim = q.shape
    kv_heads = keys.shape[1]

    def key_tiles(x: torch.Tensor) -> torch.Tensor:  # [kv_heads, B, tiles, KEY_TILE, D]
        padded = x.new_zeros(batch * tiles.width, kv_heads, dim, dtype=q.dtype)
        padded[tiles.dst] = x.index_select(0, tiles.src).to(q.dtype)
        return _key_tiles(padded).view(kv_heads, batch, -1, KEY_TILE, dim)

    one = F.pad(q[:, None], (0, 0, 0, 0, 0, QUERY_ROWS - 1))  # each query its own tile
    out = _attend(_query_tiles(one, kv_heads), key_tiles(keys), key_tiles(values), tiles.last,
                  scale)  # fmt: skip
    return _query_rows(out, heads)[::QUERY_ROWS]


def _query_tiles(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[T, QUERY_ROWS, heads, D] -> [kv_heads, T, QUERY_ROWS × group, D]: a tile's rows are its
    queries' heads that share a KV head, query-major."""
    tiles, rows, heads, dim = q.shape
    grouped = q.view(tiles, rows, kv_heads, heads // kv_heads, dim).permute(2, 0, 1, 3, 4)
    return grouped.reshape(kv_heads, tiles, -1, dim)


def _query_rows(out: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of _query_tiles, flattened: [kv_heads, T, R, D] -> [T × QUERY_ROWS, heads, D]."""
    kv_heads, tiles, _, dim = out.shape
    rows = out.view(kv_heads, tiles, QUERY_ROWS, heads // kv_heads, dim).permute(1, 2, 0, 3, 4)
    return rows.reshape(-1, heads, dim)


def _key_tiles(x: torch.Tensor) -> torch.Tensor:
    """[L, kv_heads, D] -> [kv_heads, ceil(L / KEY_TILE), KEY_TILE, D], zero-padded."""
    padded = F.pad(x, (0, 0, 0, 0, 0, -x.shape[0] % KEY_TILE))
    return padded.view(-1, KEY_TILE, *x.shape[1:]).permute(2, 0, 1, 3)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, last: torch.Tensor, scale: float
) -> torch.Tensor:
    """Query tiles q [kv_heads, T, R, D] over their key and value tiles [kv_heads, T, K,
    KEY_TILE, D] (tile i holds positions i × KEY_TILE..), their queries' last keys [T,
    QUERY_ROWS] -> [kv_heads, T, R, D]."""
    kv_heads, n_tiles, rows, dim = q.shape
    n_keys = k.shape[2]
    batch = (kv_heads, n_tiles, n_keys)
    scores = torch.bmm(
        q[:, :, None].expand(*batch, rows, dim).reshape(-1, rows, dim),
        k.transpose(-1, -2).reshape(-1, dim, KEY_TILE),
    ).view(*batch, rows, KEY_TILE)
    positions = torch.arange(n_keys * KEY_TILE, device=q.device).view(n_keys, KEY_TILE)
    visible = positions[None, :, None, :] <= last[:, None, :, None]  # [T, K, QUERY_ROWS, KT]
    visible = visible.repeat_interleave(rows // QUERY_ROWS, dim=2)[None]
    scores = (scores * scale).masked_fill(~visible, float("-inf"))
    peak = scores.amax(dim=(2, 4), keepdim=True)  # a max is exact in any order
    peak = torch.where(torch.isneginf(peak), torch.zeros_like(peak), peak)
    probs = torch.exp(scores - peak)  # masked: exactly 0
    parts = torch.bmm(probs.reshape(-1, rows, KEY_TILE), v.reshape(-1, KEY_TILE, dim)).view(
        *batch, rows, dim
    )
    sums = probs.sum(dim=-1)  # [kv_heads, T, K, R]: each over one tile
    out, total = parts[:, :, 0], sums[:, :, 0]
    for tile in range(1, n_keys):  # in key order, whatever the number of tiles
        out = out + parts[:, :, tile]
        total = total + sums[:, :, tile]
    total = torch.where(total == 0, torch.ones_like(total), total)  # a pad row: 0 / 1
    return out / total[..., None]
