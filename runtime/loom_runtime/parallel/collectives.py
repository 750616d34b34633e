"""Comm: one process group as one rank sees it, and the few collectives the parallel forward
uses: gathers of uneven rows, all-to-alls of uneven rows, a reduce-scatter, an all-reduce, a
broadcast.

A thin shell over torch.distributed (gloo on CPU, NCCL on GPU); every call runs under the
group's timeout, set when the ranks joined (ranks.py). Never decides what to send.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Comm:
    """A group of `ranks` (global ranks, in group order); this rank is `ranks[index]`.
    A group of one has no process group and every collective is the identity."""

    ranks: tuple[int, ...]
    index: int
    group: Any = None  # torch.distributed ProcessGroup; None for a group of one

    @classmethod
    def single(cls, rank: int = 0) -> Comm:
        return cls(ranks=(rank,), index=0)

    @property
    def size(self) -> int:
        return len(self.ranks)


def all_gather_same(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Every rank's `x` (same shape everywhere), stacked in group order: [W, *x.shape]."""
    if comm.size == 1:
        return x[None]
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(comm.size)]
    dist.all_gather(parts, x, group=comm.group)
    return torch.stack(parts)


def all_gather_rows(comm: Comm, x: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
    """Every rank's rows ([counts[r], ...] on rank r, counts known to all), in group order."""
    if comm.size == 1:
        return [x]
    if x.shape[0] != counts[comm.index]:
        raise ValueError(
            f"rank {comm.index} sends {x.shape[0]} rows, expected {counts[comm.index]}"
        )
    most = max(counts)
    padded = x.new_zeros((most, *x.shape[1:]))
    padded[: x.shape[0]] = x
    stacked = all_gather_same(comm, padded)
    return [stacked[r, :n] for r, n in enumerate(counts)]


def exchange_counts(comm: Comm, send_counts: Sequence[int], device: torch.device) -> list[int]:
    """How many rows each rank will send to this one, given how many this one sends each."""
    if comm.size == 1:
        return list(send_counts)
    send = torch.tensor(list(send_counts), dtype=torch.int64, device=device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=comm.group)
    return [int(c) for c in recv.tolist()]


def all_to_all_rows(
    comm: Comm,
    x: torch.Tensor,
    send_counts: Sequence[int],
    recv_counts: Sequence[int] | None = None,
) -> tuple[torch.Tensor, list[int]]:
    """Send rows [sum(send_counts), ...] grouped by destination; receive rows grouped by
    source. Exchanges the counts first unless `recv_counts` is known."""
    if recv_counts is None:
        recv_counts = exchange_counts(comm, send_counts, x.device)
    if comm.size == 1:
        return x, list(recv_counts)
    out = x.new_empty((sum(recv_counts), *x.shape[1:]))
    dist.all_to_all_single(
        out,
        x.contiguous(),
        output_split_sizes=list(recv_counts),
        input_split_sizes=list(send_counts),
        group=comm.group,
    )
    return out, list(recv_counts)


def reduce_scatter_sum(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """Sum of every rank's x ([W·n, ...]), rank r keeping rows [r·n, (r+1)·n).

    NCCL reduce-scatters; gloo has no reduce-scatter, so there it is an all-to-all of the
    chunks and a local sum (the same bytes move)."""
    if comm.size == 1:
        return x
    n = x.shape[0] // comm.size
    if dist.get_backend(comm.group) == "nccl":
        out = x.new_empty((n, *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=comm.group)
        return out
    chunks, _ = all_to_all_rows(comm, x, [n] * comm.size, [n] * comm.size)
    return chunks.view(comm.size, n, *x.shape[1:]).sum(dim=0)


def all_reduce_sum(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's x (the same shape everywhere), the same on every rank."""
    if comm.size == 1:
        return x
    x = x.contiguous().clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=comm.group)
    return x


def ordered_sum(comm: Comm, x: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's x added in group order (rank 0's, plus rank 1's, ...), the same
    on every rank: each element's bits do not depend on the tensor's size, as a ring
    all-reduce's chunking makes them (batch-invariant mode)."""
    if comm.size == 1:
        return x
    parts = all_gather_same(comm, x)
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def broadcast(comm: Comm, x: torch.Tensor, root: int = 0) -> torch.Tensor:
    """Group rank `root`'s x on every rank (x gives the shape and dtype elsewhere)."""
    if comm.size == 1:
        return x
    x = x.contiguous().clone()
    dist.broadcast(x, src=comm.ranks[root], group=comm.group)
    return x
