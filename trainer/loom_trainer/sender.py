"""The trainer's side of one push over its transfer group: the manifest, the refusal check,
then each bucket with its checksum, then the commit.

Owns the order of collectives on rank 0 (the workers' side, transfer/weight_push.py in the
runtime, runs the same order). Over the group's path it sends piece by piece from the trainer's
own tensors (a copy of one bucket's tensors only when they are not contiguous on the CPU);
over NIXL (`source`) it packs each bucket into the source's one buffer, which the workers READ.
Never a copy of the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import torch

from loom_trainer.checksum import checksum
from loom_trainer.errors import PushFailed, PushRefused
from loom_trainer.group import TransferGroup
from loom_trainer.nixl_path import NixlSource
from loom_trainer.protocol import (
    GLOO_PATH,
    Bucket,
    as_bytes,
    bucket_checksum,
    encode_manifest,
    pack,
    pieces,
)


def send_push(
    group: TransferGroup,
    workers: Sequence[str],
    buckets: Sequence[Bucket],
    tensors: Mapping[str, torch.Tensor],
    on_bucket: Callable[[int, int], None] | None = None,
    source: NixlSource | None = None,
) -> float:
    """Send `tensors` in `buckets` to `workers` (rank i + 1 is workers[i]), over the group or,
    given a `source`, over NIXL; the seconds from the first bucket to the commit (the bytes
    moving: the group and the manifest check excluded).

    PushRefused (no bucket moved) with each worker's problems when the manifest does not fit
    (or a worker cannot take the data path); PushFailed when a worker's checksum differs or its
    READ failed; RuntimeError when the group breaks.
    """
    group.broadcast_bytes(encode_manifest(buckets, source.describe() if source else GLOO_PATH))
    if not group.agree(True):
        problems = {}
        for rank, name in enumerate(workers, start=1):
            note = group.read(f"problems/{rank}")
            if isinstance(note, list) and note:
                problems[name] = [str(p) for p in note]
        lines = "; ".join(f"{w}: {', '.join(p)}" for w, p in problems.items())
        raise PushRefused(f"the pushed weights do not fit the fleet's model: {lines}", problems)
    started = time.monotonic()
    for b in buckets:
        if source is None:
            send_bucket(group, b, tensors)
        else:
            read_bucket(group, source, b, tensors)
        if on_bucket is not None:
            on_bucket(b.index, len(buckets))
    if not group.agree(True):  # the commit: every worker has staged every bucket
        raise PushFailed("not every worker staged the push")
    return time.monotonic() - started


def send_bucket(group: TransferGroup, bucket: Bucket, tensors: Mapping[str, torch.Tensor]) -> None:
    """Every piece of the bucket started at once, the checksum computed while they move, then
    the checksum and the workers' verdict."""
    sources = {s.name: as_bytes(tensors[s.name]) for s in bucket.specs}
    digest, moving = 0, []
    for p in pieces(bucket):
        data = sources[p.name][p.start : p.start + p.nbytes]
        moving.append(group.start_broadcast(data))
        digest = checksum(data, digest)
    for work in moving:
        work.wait()
    group.broadcast(torch.tensor([digest], dtype=torch.int64))
    if not group.agree(True):
        raise PushFailed(f"bucket {bucket.index}: a worker's checksum differs from the trainer's")


def read_bucket(group: TransferGroup, source: NixlSource, bucket: Bucket,
                tensors: Mapping[str, torch.Tensor]) -> None:  # fmt: skip
    """The bucket packed into the source's buffer, its checksum broadcast (the workers' cue to
    READ it), then their verdict once every worker has read and checked it."""
    buf = source.buf[: bucket.nbytes]
    pack(bucket, tensors, buf)
    group.broadcast(torch.tensor([bucket_checksum(bucket, buf)], dtype=torch.int64))
    if not group.agree(True):
        raise PushFailed(f"bucket {bucket.index}: a worker's NIXL READ failed or its checksum "
                         "differs from the trainer's")  # fmt: skip
