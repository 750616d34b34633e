"""The baseline a weight push is measured against (#37): a plain `torch.distributed` gloo
broadcast of the same tensors from rank 0 to the other ranks, each in its own process, group
already formed — tensor by tensor (what a trainer writes by hand) and packed into the push's
buckets. Bytes per second of each, the median of `repeats` rounds.

Usage (alone):
    .venv/bin/python bench/broadcast_baseline.py CHECKPOINT_DIR --dtype float64 --world 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from loom_operator.local.ports import free_ports
from loom_trainer.protocol import DEFAULT_BUCKET_BYTES, pack, plan_buckets, spec_of

TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Baseline:
    """Bytes per second of a plain broadcast to world − 1 receivers (median of the rounds)."""

    world: int
    bytes: int
    tensors: int
    per_tensor_bps: float
    packed_bps: float
    bucket_bytes: int

    @property
    def best_bps(self) -> float:
        return max(self.per_tensor_bps, self.packed_bps)


def tensors_of(checkpoint: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors in the dtype the fleet runs (what a trainer pushes)."""
    return {n: t.to(dtype) for n, t in load_file(str(checkpoint / "model.safetensors")).items()}


def _timed(fn: Callable[[], None], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        out.append(time.perf_counter() - t0)
    return out


def _rank(rank: int, world: int, port: int, job: dict[str, object], out: mp.Queue) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    url = f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world, timeout=timeout)
    dtype = getattr(torch, str(job["dtype"]))
    tensors = tensors_of(Path(str(job["checkpoint"])), dtype)
    if rank != 0:
        tensors = {n: torch.empty_like(t) for n, t in tensors.items()}
    buckets = plan_buckets([spec_of(n, t) for n, t in tensors.items()], int(str(job["bucket"])))
    buf = torch.empty(max(b.nbytes for b in buckets), dtype=torch.uint8)

    def per_tensor() -> None:
        for t in tensors.values():
            dist.broadcast(t, src=0)

    def packed() -> None:
        for b in buckets:
            view = buf[: b.nbytes]
            if rank == 0:
                pack(b, tensors, view)
            dist.broadcast(view, src=0)

    repeats = int(str(job["repeats"]))
    one, two = _timed(per_tensor, repeats), _timed(packed, repeats)
    if rank == 0:
        out.put((statistics.median(one), statistics.median(two)))
    dist.destroy_process_group()


def measure(
    checkpoint: Path,
    dtype: torch.dtype,
    world: int,
    repeats: int = 3,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> Baseline:
    """A broadcast of the checkpoint's tensors (in `dtype`) among `world` fresh processes."""
    tensors = tensors_of(checkpoint, dtype)
    nbytes, count = sum(t.numel() * t.element_size() for t in tensors.values()), len(tensors)
    del tensors
    job = {"checkpoint": str(checkpoint), "dtype": str(dtype).removeprefix("torch."),
           "bucket": bucket_bytes, "repeats": repeats}  # fmt: skip
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    port = free_ports(1)[0]
    env_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    procs = [ctx.Process(target=_rank, args=(r, world, port, job, out)) for r in range(world)]
    try:
        for p in procs:
            p.start()
        per_tensor_s, packed_s = out.get(timeout=TIMEOUT_S)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        if env_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_threads
    return Baseline(world, nbytes, count, nbytes / per_tensor_s, nbytes / packed_s,
                    bucket_bytes)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    result = measure(args.checkpoint, getattr(torch, args.dtype), args.world, args.repeats)
    print(json.dumps({**asdict(result), "best_bps": result.best_bps}))


if __name__ == "__main__":
    main()
