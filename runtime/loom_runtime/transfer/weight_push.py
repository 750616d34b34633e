"""A worker's side of a trainer's weight push: join the push's gloo group, check the manifest
against the model (and its data path: NIXL must be here to READ) before any byte moves, then
stage each bucket on local disk — over the group each piece checked and written while the next
arrives, over NIXL each bucket READ whole from the trainer's buffer, then checked and written.

Owns the staged copy of one push (one bucket in memory at a time, the rest on disk) and
discarding it when the push breaks; never touches the model (the engine swaps a staged push in
at a step boundary) and never keeps a half-received push.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from loom_runtime.errors import CheckpointError, TransferError
from loom_trainer.checksum import checksum
from loom_trainer.group import Rendezvous, TransferGroup
from loom_trainer.nixl_path import NixlSink
from loom_trainer.protocol import (
    Bucket,
    TensorSpec,
    bucket_checksum,
    check_specs,
    decode_manifest,
    pieces,
    unpack,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagedPush:
    """A complete push on local disk: every bucket received and its checksum matched."""

    update_id: str
    version: str
    directory: Path
    buckets: tuple[Bucket, ...]
    largest_bucket: int
    """Bytes of the largest bucket: the most memory receiving (or swapping in) holds at once."""
    _removal: weakref.finalize[..., None] = field(init=False, repr=False, compare=False)

    def bucket_file(self, index: int) -> Path:
        return self.directory / f"bucket-{index:05d}.bin"

    def tensors(self) -> Iterator[dict[str, torch.Tensor]]:
        """Each bucket's tensors in turn, as views into one reused buffer of the largest
        bucket's size (valid until the next bucket is read)."""
        whole = torch.empty(self.largest_bucket, dtype=torch.uint8)
        for b in self.buckets:
            buf = whole[: b.nbytes]
            with self.bucket_file(b.index).open("rb") as f:
                if f.readinto(buf.numpy().data) != b.nbytes:
                    raise TransferError(f"{self.bucket_file(b.index)}: staged bucket is short")
            yield unpack(b, buf)

    def __post_init__(self) -> None:
        # Gone at the latest when nothing refers to it or the worker exits (a worker killed
        # outright leaves it: in a pod its scratch folder goes with the pod).
        removal = weakref.finalize(self, shutil.rmtree, self.directory, ignore_errors=True)
        object.__setattr__(self, "_removal", removal)

    def discard(self) -> None:
        self._removal()


def receive_push(
    rv: Rendezvous,
    version: str,
    expected: Mapping[str, TensorSpec],
    staging_root: Path | None,
    refusal: str = "",
) -> StagedPush:
    """Take part in push `rv.update_id` as rank `rv.rank` and stage it.

    CheckpointError (nothing moved) when the manifest does not fit `expected` here or on
    another worker, or when this worker refuses any push (`refusal`, told to the trainer);
    TransferError when the group breaks (the trainer died, a timeout, a checksum differs):
    then nothing stays staged.
    """
    sink: NixlSink | None = None
    try:
        group = TransferGroup(rv)
        buckets, whole, sink = _take_manifest(group, rv, version, expected, refusal)
        directory = Path(tempfile.mkdtemp(prefix=f"loom-push-{rv.update_id}-", dir=staging_root))
        staged = StagedPush(rv.update_id, version, directory, buckets, whole.numel())
        try:
            _receive_buckets(group, staged, whole, sink)
        except BaseException:
            staged.discard()
            raise
    except RuntimeError as exc:
        raise TransferError(f"push {rv.update_id}: the transfer group broke: {exc}") from exc
    finally:
        if sink is not None:
            sink.close()
    logger.info(
        "push staged",
        extra={"update_id": rv.update_id, "version": version, "buckets": len(buckets)},
    )
    return staged


def _take_manifest(
    group: TransferGroup,
    rv: Rendezvous,
    version: str,
    expected: Mapping[str, TensorSpec],
    refusal: str,
) -> tuple[tuple[Bucket, ...], torch.Tensor, NixlSink | None]:
    """The manifest checked on every worker before any byte moves — its names, shapes and
    dtypes against `expected`, and its data path (over NIXL this worker's agent must take the
    trainer's): the buckets, one receive buffer for all of them and, over NIXL, the sink.
    CheckpointError when any worker refuses (this one tells the trainer why)."""
    try:
        buckets, path = decode_manifest(group.broadcast_bytes(None))
    except ValueError as exc:  # not a manifest this worker reads
        buckets, path, refusal = (), {}, refusal or str(exc)
    whole = torch.empty(max((b.nbytes for b in buckets), default=0), dtype=torch.uint8)
    problems = (
        [refusal] if refusal else check_specs([s for b in buckets for s in b.specs], expected)
    )
    sink = None
    if not problems and path.get("kind") == "nixl":
        try:
            sink = NixlSink(rv.update_id, rv.rank, whole, path)
        except Exception as exc:  # NIXL missing, or its agent cannot take the trainer's
            problems = [f"transport nixl: {exc}"]
    if problems:
        group.tell(f"problems/{rv.rank}", problems)
    try:
        if not group.agree(not problems):
            why = "; ".join(problems) if problems else "another worker refused it"
            raise CheckpointError(f"push {rv.update_id} of {version} refused: {why}")
    except BaseException:
        if sink is not None:
            sink.close()
        raise
    return buckets, whole, sink


def _receive_buckets(group: TransferGroup, staged: StagedPush, whole: torch.Tensor,
                     sink: NixlSink | None) -> None:  # fmt: skip
    try:
        for b in staged.buckets:
            buf, path = whole[: b.nbytes], staged.bucket_file(b.index)
            expected = torch.zeros(1, dtype=torch.int64)
            if sink is None:
                digest = _receive_bucket(group, b, buf, path)
                group.broadcast(expected)
            else:
                group.broadcast(expected)  # the trainer packed it: READ it now
                digest = _read_bucket(sink, b, buf, path, group.rv.timeout_s)
            ok = digest == int(expected.item())
            if not group.agree(ok):
                raise TransferError(
                    f"push {staged.update_id}: bucket {b.index}'s checksum differs on "
                    f"{'this worker' if not ok else 'another worker'}"
                )
        if not group.agree(True):
            raise TransferError(f"push {staged.update_id}: not every worker staged it")
    except RuntimeError as exc:
        raise TransferError(f"push {staged.update_id}: the transfer group broke: {exc}") from exc


def _receive_bucket(group: TransferGroup, bucket: Bucket, buf: torch.Tensor, path: Path) -> int:
    """Every piece of the bucket started at once into `buf`; each piece checksummed and written
    to `path` as soon as it has arrived, while the next ones move. The bucket's checksum."""
    parts = pieces(bucket)
    moving = [group.start_broadcast(buf[p.offset : p.offset + p.nbytes]) for p in parts]
    digest, written = 0, 0
    with path.open("wb") as f:
        for p, work in zip(parts, moving, strict=True):
            work.wait()
            digest = checksum(buf[p.offset : p.offset + p.nbytes], digest)
            f.write(buf[written : p.offset + p.nbytes].numpy().data)  # the padding before it too
            written = p.offset + p.nbytes
        f.write(buf[written:].numpy().data)
    return digest


def _read_bucket(sink: NixlSink, bucket: Bucket, buf: torch.Tensor, path: Path,
                 timeout_s: float) -> int:  # fmt: skip
    """The bucket READ whole from the trainer's buffer into `buf`, written to `path`; its
    checksum (-1 when the READ failed: the verdict then fails the push everywhere)."""
    try:
        sink.read(bucket.nbytes, timeout_s)
    except Exception as exc:  # NIXL raises its own types too
        logger.warning("push READ failed: %s", exc, extra={"bucket": bucket.index})
        return -1
    with path.open("wb") as f:
        f.write(buf.numpy().data)
    return bucket_checksum(bucket, buf)
