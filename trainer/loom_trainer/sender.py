"""The trainer's side of one push over its transfer group: the manifest, the refusal check,
then each bucket with its checksum, then the commit.

Owns the order of collectives on rank 0 (the workers' side, transfer/weight_push.py in the
runtime, runs the same order); holds one packed bucket at a time, never a copy of the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from loom_trainer.errors import PushFailed, PushRefused
from loom_trainer.group import TransferGroup
from loom_trainer.protocol import Bucket, checksum, encode_manifest, pack


def send_push(
    group: TransferGroup,
    workers: Sequence[str],
    buckets: Sequence[Bucket],
    tensors: Mapping[str, torch.Tensor],
    on_bucket: Callable[[int, int], None] | None = None,
) -> None:
    """Send `tensors` in `buckets` to `workers` (rank i + 1 is workers[i]).

    PushRefused (no bucket moved) with each worker's problems when the manifest does not fit;
    PushFailed when a worker's checksum differs; RuntimeError when the group breaks.
    """
    group.broadcast_bytes(encode_manifest(buckets))
    if not group.agree(True):
        problems = {}
        for rank, name in enumerate(workers, start=1):
            note = group.read(f"problems/{rank}")
            if isinstance(note, list) and note:
                problems[name] = [str(p) for p in note]
        lines = "; ".join(f"{w}: {', '.join(p)}" for w, p in problems.items())
        raise PushRefused(f"the pushed weights do not fit the fleet's model: {lines}", problems)
    whole = torch.empty(max((b.nbytes for b in buckets), default=0), dtype=torch.uint8)
    for b in buckets:
        buf = whole[: b.nbytes]
        pack(b, tensors, buf)
        group.broadcast(buf)
        group.broadcast(torch.tensor([checksum(buf)], dtype=torch.int64))
        if not group.agree(True):
            raise PushFailed(f"bucket {b.index}: a worker's checksum differs from the trainer's")
        if on_bucket is not None:
            on_bucket(b.index, len(buckets))
    if not group.agree(True):  # the commit: every worker has staged every bucket
        raise PushFailed("not every worker staged the push")
