"""The weight-push wire format a trainer and the workers share: the manifest of names, shapes
and dtypes, the plan of bounded buckets and their pieces (checksum.py hashes each piece).

Owns the byte layout of a push; never opens a connection (group.py does) and never decides
what a worker does with the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from loom_trainer.checksum import checksum

DEFAULT_BUCKET_BYTES = 64 << 20
"""Bytes per broadcast when the trainer does not say: bounds the extra memory of a push."""
ALIGN = 16
"""Each tensor starts at a multiple of this in its bucket, so it can be viewed in place."""
PIECE_BYTES = 4 << 20
"""The most one broadcast moves: a bucket travels as pieces of its tensors, so a worker checks
and stages one piece while the next arrives, and the trainer sends from its own tensors."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class TensorSpec:
    """One pushed tensor as the manifest describes it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """torch's name without the prefix: float32, bfloat16, …"""

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * torch_dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Bucket:
    """Tensors sent in one broadcast, packed back to back in manifest order."""

    index: int
    specs: tuple[TensorSpec, ...]

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each tensor starts in the bucket (aligned to ALIGN)."""
        out, at = [], 0
        for s in self.specs:
            out.append(at)
            at = _aligned(at + s.nbytes)
        return tuple(out)

    @property
    def nbytes(self) -> int:
        if not self.specs:
            return 0
        return self.offsets[-1] + self.specs[-1].nbytes


@dataclass(frozen=True)
class Piece:
    """One broadcast of a push: `nbytes` bytes of tensor `name` from byte `start` of the tensor,
    landing at byte `offset` of its bucket."""

    name: str
    start: int
    offset: int
    nbytes: int


def pieces(bucket: Bucket, piece_bytes: int = PIECE_BYTES) -> tuple[Piece, ...]:
    """The bucket's tensors cut into pieces of at most `piece_bytes`, in bucket order (an empty
    tensor has none)."""
    return tuple(
        Piece(s.name, start, offset + start, min(piece_bytes, s.nbytes - start))
        for s, offset in zip(bucket.specs, bucket.offsets, strict=True)
        for start in range(0, s.nbytes, piece_bytes)
    )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight-push manifest")
    return dtype


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, tuple(tensor.shape), dtype_name(tensor.dtype))


def plan_buckets(specs: Sequence[TensorSpec], max_bytes: int) -> tuple[Bucket, ...]:
    """Consecutive tensors grouped into buckets of at most `max_bytes` (a tensor larger than
    that travels alone, so a bucket is at most max(max_bytes, the largest tensor))."""
    if max_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {max_bytes}")
    buckets: list[Bucket] = []
    current: list[TensorSpec] = []
    size = 0
    for s in specs:
        if current and _aligned(size) + s.nbytes > max_bytes:
            buckets.append(Bucket(len(buckets), tuple(current)))
            current, size = [], 0
        current.append(s)
        size = _aligned(size) + s.nbytes
    if current:
        buckets.append(Bucket(len(buckets), tuple(current)))
    return tuple(buckets)


GLOO_PATH: Mapping[str, object] = {"kind": "gloo"}
"""The data path where the buckets' bytes travel as the group's broadcasts (nixl_path.py
describes the other)."""


def encode_manifest(buckets: Sequence[Bucket], path: Mapping[str, object] = GLOO_PATH) -> bytes:
    """The manifest: every bucket's names, shapes and dtypes, and the data path of the bytes."""
    doc = {"buckets": [[[s.name, list(s.shape), s.dtype] for s in b.specs] for b in buckets],
           "path": dict(path)}  # fmt: skip
    return json.dumps(doc).encode()


def decode_manifest(data: bytes) -> tuple[tuple[Bucket, ...], dict[str, Any]]:
    """The buckets and the data path of a manifest; ValueError when it is not one (a trainer
    of another Loom version)."""
    doc = json.loads(data.decode())
    if not isinstance(doc, dict) or not isinstance(doc.get("buckets"), list) or "path" not in doc:
        raise ValueError("the trainer's manifest is not this worker's format (a loom_trainer of "
                         "another Loom version?)")  # fmt: skip
    buckets = tuple(
        Bucket(i, tuple(TensorSpec(n, tuple(shape), dt) for n, shape, dt in b))
        for i, b in enumerate(doc["buckets"])
    )
    return buckets, dict(doc["path"])


def bucket_checksum(bucket: Bucket, buf: torch.Tensor) -> int:
    """A packed bucket's checksum: its pieces' bytes folded in order (the padding between
    tensors excluded), as the group's path computes it piece by piece."""
    digest = 0
    for p in pieces(bucket):
        digest = checksum(buf[p.offset : p.offset + p.nbytes], digest)
    return digest


def _listed(label: str, items: Sequence[str]) -> list[str]:
    return [f"{label}: {', '.join(items)}"] if items else []


def check_specs(pushed: Sequence[TensorSpec], expected: Mapping[str, TensorSpec]) -> list[str]:
    """Every way `pushed` does not fit a model whose tensors are `expected` (empty: it fits).
    A push is a whole version: every expected name must come, and nothing else."""
    names = [s.name for s in pushed]
    seen = set(names)
    twice = sorted({n for n in names if names.count(n) > 1})
    unknown = sorted(seen - set(expected))
    missing = sorted(set(expected) - seen)
    shape = [
        f"{s.name} {s.shape} != {expected[s.name].shape}"
        for s in pushed
        if s.name in expected and s.shape != expected[s.name].shape
    ]
    dtype = [
        f"{s.name} {s.dtype} != {expected[s.name].dtype}"
        for s in pushed
        if s.name in expected and s.dtype != expected[s.name].dtype
    ]
    return [
        *_listed("sent twice", twice),
        *_listed("unknown", unknown),
        *_listed("missing", missing),
        *_listed("shape", shape),
        *_listed("dtype", dtype),
    ]


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 CPU tensor (a view when it is already contiguous)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8)


def pack(bucket: Bucket, tensors: Mapping[str, torch.Tensor], out: torch.Tensor) -> None:
    """Copy the bucket's tensors into `out` (uint8, bucket.nbytes long), back to back."""
    for s, offset in zip(bucket.specs, bucket.offsets, strict=True):
        out[offset : offset + s.nbytes].copy_(as_bytes(tensors[s.name]))


def unpack(bucket: Bucket, buf: torch.Tensor) -> dict[str, torch.Tensor]:
    """The bucket's tensors as views into `buf` (no copy)."""
    out = {}
    for s, offset in zip(bucket.specs, bucket.offsets, strict=True):
        view = buf[offset : offset + s.nbytes].view(torch_dtype(s.dtype)).reshape(s.shape)
        out[s.name] = view
    return out
