"""The checksum of a push's pieces: a 64-bit multilinear hash that torch computes with one
integer matrix product, part of the wire format (trainer and workers must agree on it).

Why not CRC-32: on a 2-core machine the trainer and every worker each checksumming every byte
with zlib's CRC-32 (~3.5 GB/s on one core) halved the push's rate; this hash runs at ~6 GB/s
on one core. It is not cryptographic: it proves the bytes arrived as sent (any changed word,
words swapped within a row, rows or pieces reordered), not that nobody forged them.

Owns the arithmetic only; never decides what is hashed (sender.py and the worker's
transfer/weight_push.py hash each piece of a bucket, in order).
"""

from __future__ import annotations

import torch

ROW_WORDS = 1024
"""Little-endian 64-bit words per row: each row is dotted with KEYS."""
_MASK = (1 << 64) - 1
_FOLD = 0x100000001B3
"""The odd multiplier that folds row hashes, the tail and the length in order."""
_ROWS_AT_ONCE = 512
"""Rows folded by one vector product (a 4 MiB piece is 512 rows)."""


def _signed(u: int) -> int:
    return u - (1 << 64) if u >> 63 else u


def _splitmix64(seed: int, n: int) -> list[int]:
    out, state = [], seed
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & _MASK
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        out.append(z ^ (z >> 31))
    return out


KEYS = torch.tensor([_signed(k | 1) for k in _splitmix64(0x4C4F4F4D, ROW_WORDS)], dtype=torch.int64)
"""One odd key per word of a row (splitmix64 from a fixed seed: the same on every machine)."""
_POWERS = torch.tensor(
    [_signed(pow(_FOLD, _ROWS_AT_ONCE - 1 - i, 1 << 64)) for i in range(_ROWS_AT_ONCE)],
    dtype=torch.int64,
)
"""_FOLD^(n-1-i) for row i of n: folding n row hashes is one dot product with the last n."""


def _fold(acc: int, value: int) -> int:
    return (acc * _FOLD + value) & _MASK


def checksum(buf: torch.Tensor, running: int = 0) -> int:
    """The hash of a uint8 CPU tensor's bytes folded onto `running` (read in place unless the
    bytes are not 8-byte aligned in memory; then one copy of them), as a signed 64-bit int (it
    travels as an int64 tensor). A bucket's checksum folds its pieces' hashes in order, so
    sender and worker must cut the same pieces (protocol.pieces)."""
    data = buf.reshape(-1)
    if (data.storage_offset() * data.element_size()) % 8:
        data = data.clone()
    n = data.numel()
    words = n // 8
    acc = running & _MASK
    if words:
        rows = data[: words * 8].view(torch.int64)
        full = words // ROW_WORDS
        hashes = rows[: full * ROW_WORDS].view(full, ROW_WORDS) @ KEYS
        for start in range(0, full, _ROWS_AT_ONCE):
            chunk = hashes[start : start + _ROWS_AT_ONCE]
            k = chunk.numel()
            acc = (acc * pow(_FOLD, k, 1 << 64) + int(chunk @ _POWERS[_ROWS_AT_ONCE - k :])) & _MASK
        if rem := words - full * ROW_WORDS:
            acc = _fold(acc, int(rows[full * ROW_WORDS :] @ KEYS[:rem]))
    acc = _fold(acc, int.from_bytes(data[words * 8 :].numpy().tobytes(), "little"))
    return _signed(_fold(acc, n))
