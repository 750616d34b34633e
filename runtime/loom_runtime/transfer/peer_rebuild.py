"""A pushed version rebuilt from a peer: a worker that restarts after a trainer's push receives
the weights a serving peer holds, over the push's own wire format (loom_trainer), in a group of
two — the peer rank 0 and sending, the restarted worker rank 1, hosting the TCPStore.

Owns both sides of one peer transfer (send a model's tensors; receive and stage them while the
peer is asked to send); never swaps weights in (the engine does) and never chooses the peer
(the fleet controller does).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from pathlib import Path
from typing import Any, TypeVar

import torch

from loom_runtime.errors import TransferError
from loom_runtime.transfer.weight_push import StagedPush, receive_push
from loom_trainer.errors import PushFailed, PushRefused
from loom_trainer.group import Rendezvous, TransferGroup
from loom_trainer.protocol import DEFAULT_BUCKET_BYTES, TensorSpec, plan_buckets, spec_of
from loom_trainer.sender import send_push

T = TypeVar("T")
RECEIVER_RANK = 1


def send_weights(
    rv: Rendezvous,
    tensors: Mapping[str, torch.Tensor],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    specs: Mapping[str, TensorSpec] | None = None,
) -> float:
    """As rank 0 of `rv`'s group of two, send `tensors` as a push (the receiver checks them
    against its model first); the seconds the bytes moved. `specs`: what `tensors` hold, when
    reading them all to learn it would cost a copy of the model (tensors read from disk as
    their bucket goes). TransferError when the receiver refuses, a checksum differs or the
    group breaks."""
    try:
        group = TransferGroup(rv)
        manifest = [spec_of(n, t) for n, t in tensors.items()] if specs is None else [
            specs[n] for n in tensors
        ]  # fmt: skip
        buckets = plan_buckets(manifest, bucket_bytes)
        return send_push(group, ["the rebuilding peer"], buckets, tensors)
    except (PushRefused, PushFailed, RuntimeError) as exc:
        raise TransferError(f"sending the weights of push {rv.update_id}: {exc}") from exc


def rendezvous(host: str, update_id: str, timeout_s: float) -> Rendezvous:
    """The receiver's side of a peer transfer: a free port on `host` for the store it hosts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = int(s.getsockname()[1])
    return Rendezvous(host, port, RECEIVER_RANK, 2, timeout_s, update_id, RECEIVER_RANK)


def receive_from_peer(
    rv: Rendezvous,
    version: str,
    expected: Mapping[str, TensorSpec],
    ask_peer: Callable[[], None],
    staging_root: Path | None = None,
) -> StagedPush:
    """Stage `version` from a peer: receive as rank 1 of `rv` (hosting its store) while
    `ask_peer` (a blocking call that makes the peer send) runs beside it. The first failure of
    either ends it with TransferError (or CheckpointError: the peer's weights do not fit the
    model), without waiting for the other's timeout; nothing stays staged then."""
    receiving = _spawn(lambda: receive_push(rv, version, expected, staging_root))
    asking = _spawn(ask_peer)
    both: list[Future[Any]] = [receiving, asking]
    done, _ = wait(both, timeout=rv.timeout_s * 4, return_when=FIRST_EXCEPTION)
    for f in done:
        exc = f.exception()
        if exc is not None:
            if f is asking and receiving.done() and receiving.exception() is None:
                receiving.result().discard()
            raise exc
    if len(done) < 2:
        raise TransferError(f"push {rv.update_id}: the peer transfer did not end in time")
    return receiving.result()


def _spawn(fn: Callable[[], T]) -> Future[T]:
    """`fn` on a daemon thread (a process that gives up on a transfer exits without it)."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="loom-peer-transfer", daemon=True).start()
    return future
