"""The transfer group of one push: a gloo process group of the trainer (rank 0) and every
worker, met through the trainer's TCPStore, and the few collectives both sides run.

Owns the rendezvous and a timeout on every collective; never touches the process-wide default
group (each push makes its own group and drops it), and never decides what is sent.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore, Work
from torch.distributed.distributed_c10d import PrefixStore, Store

PREFIX = "loom-push"


class _Collectives(Protocol):
    """The two collectives a push runs (gloo's backend has them; torch's stubs do not say)."""

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> Work: ...

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> Work: ...


@dataclass(frozen=True)
class Rendezvous:
    """Where and how one push's group meets."""

    host: str
    port: int
    rank: int
    world_size: int
    timeout_s: float
    update_id: str
    store_rank: int = 0
    """The rank that hosts the TCPStore at host:port: the trainer (0), or a restarted worker
    rebuilding a push from a peer (runtime's transfer/peer_rebuild.py)."""


class TransferGroup:
    """One push's gloo group. Rank 0 sends; `rv.store_rank` hosts the TCPStore."""

    def __init__(self, rv: Rendezvous) -> None:
        self.rv = rv
        timeout = datetime.timedelta(seconds=rv.timeout_s)
        self.store: Store = TCPStore(
            rv.host,
            rv.port,
            world_size=rv.world_size,
            is_master=rv.rank == rv.store_rank,
            timeout=timeout,
            wait_for_workers=False,
        )
        prefixed = PrefixStore(f"{PREFIX}/{rv.update_id}", self.store)
        gloo = dist.ProcessGroupGloo(prefixed, rv.rank, rv.world_size, timeout)
        self._pg = cast(_Collectives, gloo)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's `tensor` into every rank's `tensor` (same shape and dtype everywhere)."""
        self.start_broadcast(tensor).wait()

    def start_broadcast(self, tensor: torch.Tensor) -> Work:
        """`broadcast` started, not awaited: its `wait()` returns once `tensor` has moved (every
        rank must start the same broadcasts in the same order; the caller leaves `tensor` alone
        until then)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = datetime.timedelta(seconds=self.rv.timeout_s)
        return self._pg.broadcast([tensor], opts)

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's `data` on every rank (others pass None)."""
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        self.broadcast(size)
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
        if data is not None:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self.broadcast(buf)
        return buf.numpy().tobytes()

    def agree(self, ok: bool) -> bool:
        """True on every rank when every rank passed True."""
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        opts.timeout = datetime.timedelta(seconds=self.rv.timeout_s)
        self._pg.allreduce([flag], opts).wait()
        return bool(flag.item())

    def tell(self, key: str, value: object) -> None:
        """Leave a small JSON note for rank 0 (a worker's refusal) in the store."""
        self.store.set(f"{PREFIX}/{self.rv.update_id}/note/{key}", json.dumps(value))

    def read(self, key: str) -> object | None:
        """A note some rank left (None when there is none)."""
        full = f"{PREFIX}/{self.rv.update_id}/note/{key}"
        if not self.store.check([full]):
            return None
        note: object = json.loads(self.store.get(full).decode())
        return note
