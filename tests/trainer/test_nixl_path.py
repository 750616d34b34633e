"""A push over NIXL (real agents over UCX, in-process threads for the trainer and two workers):
each worker READs every bucket from the trainer's one registered buffer and stages exactly the
bytes sent; a worker that cannot use NIXL refuses the whole push before any byte moves, naming
why; a READ that fails on one worker fails the push everywhere and leaves nothing staged."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from loom_runtime.errors import CheckpointError, TransferError
from loom_runtime.transfer.peer_rebuild import rendezvous
from loom_runtime.transfer.weight_push import StagedPush, receive_push
from loom_trainer import nixl_path
from loom_trainer.errors import PushFailed, PushRefused
from loom_trainer.group import Rendezvous, TransferGroup
from loom_trainer.nixl_path import NixlSink, NixlSource
from loom_trainer.protocol import plan_buckets, spec_of
from loom_trainer.sender import send_push

TENSORS = {f"w{i}": torch.randn(300, 700 + i, generator=torch.Generator().manual_seed(i))
           for i in range(6)}  # fmt: skip
SPECS = {n: spec_of(n, t) for n, t in TENSORS.items()}
BUCKETS = plan_buckets(list(SPECS.values()), 2 << 20)  # three buckets


def push(update_id: str, tmp_path: Path) -> tuple[dict[int, StagedPush | BaseException], Any]:
    """Push TENSORS over NIXL to workers 1 and 2; what each worker got (its staged push or its
    error) and what the trainer's send returned or raised."""
    rv = rendezvous("127.0.0.1", update_id, 20.0)
    got: dict[int, StagedPush | BaseException] = {}

    def worker(rank: int) -> None:
        mine = Rendezvous(rv.host, rv.port, rank, 3, rv.timeout_s, update_id, 1)
        try:
            got[rank] = receive_push(mine, "v2", SPECS, tmp_path)
        except BaseException as exc:  # the test reads it
            got[rank] = exc

    threads = [threading.Thread(target=worker, args=(rank,)) for rank in (1, 2)]
    for t in threads:
        t.start()
    source = NixlSource(update_id, max(b.nbytes for b in BUCKETS))
    try:
        trainer = Rendezvous(rv.host, rv.port, 0, 3, rv.timeout_s, update_id, 1)
        sent: Any = send_push(TransferGroup(trainer), ["w1", "w2"], BUCKETS, TENSORS, None, source)
    except BaseException as exc:  # the test reads it
        sent = exc
    finally:
        source.close()
        for t in threads:
            t.join(60)
    return got, sent


def staged_tensors(staged: StagedPush) -> dict[str, torch.Tensor]:
    return {n: t.clone() for part in staged.tensors() for n, t in part.items()}


def test_every_worker_reads_every_bucket_and_stages_exactly_the_bytes(tmp_path: Path) -> None:
    got, sent = push("nx-ok", tmp_path)
    assert isinstance(sent, float) and len(BUCKETS) == 3
    for staged in got.values():
        assert isinstance(staged, StagedPush), staged
        held = staged_tensors(staged)
        assert held.keys() == TENSORS.keys()
        assert all(torch.equal(held[n], t) for n, t in TENSORS.items())
        staged.discard()


def test_a_worker_without_nixl_refuses_the_push_before_any_byte_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = NixlSink.__init__

    def missing(self: NixlSink, *args: Any) -> None:
        if "worker2" in f"{args[0]}-worker{args[1]}":
            raise RuntimeError(nixl_path.MISSING)
        made(self, *args)

    monkeypatch.setattr(NixlSink, "__init__", missing)
    got, sent = push("nx-missing", tmp_path)
    assert isinstance(sent, PushRefused)
    assert sent.problems == {"w2": [f"transport nixl: {nixl_path.MISSING}"]}
    assert all(isinstance(e, CheckpointError) for e in got.values())
    assert not any(tmp_path.iterdir()), "nothing was staged"


def test_a_read_that_fails_on_one_worker_fails_the_push_and_stages_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: Callable[..., None] = NixlSink.read

    def broken(self: NixlSink, nbytes: int, timeout_s: float) -> None:
        if self.name.endswith("worker1"):
            raise RuntimeError("the NIXL READ ended in state ERR")
        read(self, nbytes, timeout_s)

    monkeypatch.setattr(NixlSink, "read", broken)
    got, sent = push("nx-fail", tmp_path)
    assert isinstance(sent, PushFailed)
    assert "bucket 0: a worker's NIXL READ failed" in str(sent)
    assert all(isinstance(e, TransferError) for e in got.values())
    assert not any(tmp_path.iterdir()), "nothing stays staged"
