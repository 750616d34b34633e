"""What splitting a llama worker over two tensor-parallel ranks costs or gives on this machine,
side by side in one run.

The tiny llama checkpoint serves N concurrent 256-token requests (32 new tokens each, stepped on
one thread) on one engine with both cores (the baseline) and on a TP2 engine (two gloo rank
processes, one core each: half the heads, half the MLP and half the KV each, two all-reduces
per layer). Reports output tokens per second, the ratio to the baseline and the KV bytes one
token costs a rank, medians of --rounds (the two alternate, each on a fresh engine); every
run's tokens are checked equal to the baseline's (float64, so TP's regrouped sums cannot flip a
greedy token). Usage:

    PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/tensor_parallel.py [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from side_by_side import bench_args, report, serve_together

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.tiny import init_tiny
from loom_runtime.parallel.layout import ParallelLayout


@dataclass(frozen=True)
class Row:
    requests: int
    case: str
    tokens_per_s: float
    ratio: float  # this case's tokens per second over one rank's
    kv_bytes_per_token_per_rank: int
    identical: bool


@dataclass(frozen=True)
class Served:
    tokens: dict[str, tuple[int, ...]]
    seconds: float
    kv_per_rank: int


def prompts(n: int, length: int) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(n)
    return [tuple(torch.randint(10, 4000, (length,), generator=gen).tolist()) for _ in range(n)]


def serve(ckpt: Path, tp: int, batch: list[tuple[int, ...]], new: int) -> Served:
    """All of `batch` at once on a fresh engine (tp 1: in this process)."""
    config = EngineConfig(
        dtype=torch.float64,
        num_blocks=1024,
        max_model_len=2048,
        max_num_batched_tokens=2048,
        max_num_seqs=len(batch),
        parallel=ParallelLayout(tp=tp),
    )
    engine = Engine.from_checkpoint(ckpt, config)
    try:
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
        engine.generate(tuple(range(5, 37)), params)  # warm up
        reqs = [EngineRequest(f"r{i}", p, params) for i, p in enumerate(batch)]
        start = time.perf_counter()
        tokens = serve_together(engine, reqs)
        seconds = time.perf_counter() - start
        stats = engine.stats()
    finally:
        engine.shutdown()
    per_rank = stats.ranks[0].kv_bytes_per_token if stats.ranks else stats.kv_bytes_per_token
    return Served(tokens, seconds, per_rank)


def run(counts: list[int], length: int, new: int, rounds: int) -> list[Row]:
    torch.set_num_threads(2)  # one rank: both cores; TP2: one each
    ckpt = init_tiny(Path(tempfile.mkdtemp()) / "tiny")
    rows: list[Row] = []
    for n in counts:
        batch = prompts(n, length)
        runs: dict[int, list[Served]] = {1: [], 2: []}
        for r in range(rounds):
            for tp in (1, 2):
                served = serve(ckpt, tp, batch, new)
                runs[tp].append(served)
                print(f"round {r + 1}/{rounds} {n} requests tp={tp}: "
                      f"{n * new / served.seconds:.1f} tok/s", file=sys.stderr)  # fmt: skip
        reference = runs[1][0].tokens
        base = statistics.median(n * new / s.seconds for s in runs[1])
        for tp, case in ((1, "one rank, 2 threads"), (2, "TP2, 1 thread per rank")):
            rate = statistics.median(n * new / s.seconds for s in runs[tp])
            rows.append(Row(n, case, rate, rate / base, runs[tp][0].kv_per_rank,
                            all(s.tokens == reference for s in runs[tp])))  # fmt: skip
    return rows


def main() -> int:
    args = bench_args(__doc__)
    rows = run([2], 40, 3, 1) if args.quick else run([1, 8], 256, 32, args.rounds)
    columns = [("requests", "---:"), ("case", "---"), ("tok/s", "---:"),
               ("vs one rank", "---:"), ("KV bytes/token/rank", "---:"),
               ("identical", "---")]  # fmt: skip

    def cells(r: Row) -> list[str]:
        return [str(r.requests), r.case, f"{r.tokens_per_s:.1f}", f"{r.ratio:.2f}×",
                str(r.kv_bytes_per_token_per_rank), str(r.identical)]  # fmt: skip

    return report(columns, rows, cells, args.json)


if __name__ == "__main__":
    sys.exit(main())
