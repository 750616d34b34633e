"""What batching a step's decodes into one forward on the ranks gives, side by side in one run.

A parallel engine of the tiny sparse-mla checkpoint (fp32, gloo ranks, prefix caching off)
serves N concurrent requests twice per round: with the ranks running each step's decodes one
forward per request (the baseline: how the ranks ran before) and as one batched forward over
all of them (decode_batch: one attention call, one FFN, one EP exchange and one DCP top-k and
merge per layer for the whole batch). Reports output tokens per second and the ratio to the
baseline, medians of --rounds (the two alternate), for PCP2×DCP2, PCP2 with EP2 and DP2
with EP2 (each rank attends over half the requests); every
run's tokens are checked equal to the baseline's. Usage:

    PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/ranked_batch.py [--quick]
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
from loom_runtime.engine.ranks.ranked_runner import start_ranks
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import load_model
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.parallel.layout import ParallelLayout

LAYOUTS = {
    "pcp2-dcp2": ParallelLayout(pcp=2, dcp=2),
    "pcp2-ep2": ParallelLayout(pcp=2, ep=2),
    "dp2-ep2": ParallelLayout(dp=2, ep=2),
}


@dataclass(frozen=True)
class Row:
    layout: str
    requests: int
    case: str
    tokens_per_s: float
    ratio: float  # this case's tokens per second over the baseline's
    rank_forwards: int  # forwards each rank ran for the run's works
    works: int
    identical: bool


@dataclass(frozen=True)
class Served:
    tokens: dict[str, tuple[int, ...]]
    seconds: float
    rank_forwards: int
    works: int


def prompts(n: int, length: int) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(n)
    return [tuple(torch.randint(10, 4000, (length,), generator=gen).tolist()) for _ in range(n)]


def serve(
    ckpt: Path, layout: ParallelLayout, batch: list[tuple[int, ...]], new: int, batched: bool
) -> Served:
    """All of `batch` at once on a fresh engine of `layout`, stepped on this thread."""
    config = EngineConfig(
        num_blocks=1024,
        max_model_len=2048,
        max_num_batched_tokens=2048,
        max_num_seqs=len(batch),
        parallel=layout,
        prefix_caching=False,
    )
    loaded = load_model(ckpt, dtype=config.dtype, weights=False)
    ranks = start_ranks(str(ckpt), config, 2048, batch_decodes=batched)
    engine = Engine(loaded, config, ranks=ranks)
    try:
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
        engine.generate(tuple(range(5, 37)), params)  # warm the ranks
        forwards, works = ranks.rank_forwards, ranks.works_run
        reqs = [EngineRequest(f"r{i}", p, params) for i, p in enumerate(batch)]
        start = time.perf_counter()
        tokens = serve_together(engine, reqs)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
    return Served(
        tokens=tokens,
        seconds=seconds,
        rank_forwards=ranks.rank_forwards - forwards,
        works=ranks.works_run - works,
    )


def run(layouts: list[str], counts: list[int], length: int, new: int, rounds: int) -> list[Row]:
    torch.set_num_threads(2)  # the ranks share the cores: one thread each
    ckpt = init_tiny_sparse_mla(Path(tempfile.mkdtemp()) / "tiny")
    rows: list[Row] = []
    for name in layouts:
        for n in counts:
            batch = prompts(n, length)
            runs: dict[bool, list[Served]] = {False: [], True: []}
            for r in range(rounds):
                for batched in (False, True):
                    served = serve(ckpt, LAYOUTS[name], batch, new, batched)
                    runs[batched].append(served)
                    print(f"round {r + 1}/{rounds} {name} {n} requests batched={batched}: "
                          f"{n * new / served.seconds:.1f} tok/s", file=sys.stderr)  # fmt: skip
            reference = runs[False][0].tokens
            base = statistics.median(n * new / s.seconds for s in runs[False])
            for batched, case in ((False, "one forward per decode"), (True, "batched decodes")):
                rate = statistics.median(n * new / s.seconds for s in runs[batched])
                last = runs[batched][-1]
                rows.append(Row(name, n, case, rate, rate / base, last.rank_forwards, last.works,
                                all(s.tokens == reference for s in runs[batched])))  # fmt: skip
    return rows


def main() -> int:
    args = bench_args(__doc__)
    if args.quick:
        rows = run(["pcp2-dcp2"], [3], 40, 3, 1)
    else:
        rows = run(list(LAYOUTS), [4, 8], 256, 32, args.rounds)
    columns = [("layout", "---"), ("requests", "---:"), ("case", "---"), ("tok/s", "---:"),
               ("vs one forward per decode", "---:"), ("rank forwards / works", "---:"),
               ("identical", "---")]  # fmt: skip

    def cells(r: Row) -> list[str]:
        return [r.layout, str(r.requests), r.case, f"{r.tokens_per_s:.1f}", f"{r.ratio:.2f}×",
                f"{r.rank_forwards} / {r.works}", str(r.identical)]  # fmt: skip

    return report(columns, rows, cells, args.json)


if __name__ == "__main__":
    sys.exit(main())
