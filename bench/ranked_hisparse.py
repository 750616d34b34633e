"""Hybrid HiSparse on DP × EP ranks against the same ranks holding every row, side by side in
one run.

A DP2×EP2 engine (the reference decode's DP × EP shape on 2 gloo ranks) of the tiny sparse-mla
checkpoint (fp32, index top-k 64, one intra-op thread per rank) serves N concurrent greedy
requests of one context length, with every row attended from the rank's own copy (HiSparse
off) and with each rank's requests in tiers: rows in host memory, keys on the device, hot
buffers of S rows per layer (S = top-k + 1, the least that fits a selection, and the default
2 × top-k + 1). Every HiSparse run's tokens are checked equal to HiSparse off. Reports output
tokens per wall-clock second (prefill included) and its ratio to HiSparse off, the hot
buffers' hit rate, the rows' bytes copied in per output token, and per token of context the
bytes each rank keeps on the device and in its host tier, medians of `--rounds`. Usage:

    PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/ranked_hisparse.py \
        [--quick] [--json P]
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from side_by_side import bench_args, report

from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK, init_tiny_sparse_mla
from loom_runtime.parallel.layout import ParallelLayout

LAYOUT = ParallelLayout(dp=2, ep=2)
HOT = {"top-k + 1": INDEX_TOPK + 1, "2 × top-k + 1": 2 * INDEX_TOPK + 1}


@dataclass(frozen=True)
class Served:
    outputs: dict[str, tuple[int, ...]]
    seconds: float
    hits: int
    misses: int
    h2d_bytes: int
    device_per_token: float  # bytes on the device per token of context held (ranks summed)
    host_per_token: float


@dataclass(frozen=True)
class Row:
    context: int
    concurrency: int
    mode: str
    tokens_per_s: float
    ratio: float
    hit_rate: float
    h2d_kib_per_token: float
    device_bytes_per_token: float
    host_bytes_per_token: float
    identical: bool


def serve(checkpoint: Path, reqs: list[EngineRequest], hot: int) -> Served:
    """Serve `reqs` together on DP2×EP2 ranks, HiSparse with `hot` slots (0: off)."""
    tiers = dict(hisparse_host_pool_gib=0.04, hisparse_hot_slots=hot) if hot else {}
    config = EngineConfig(num_blocks=None if hot else 2048, max_model_len=8192, max_num_seqs=16,
                          parallel=LAYOUT, collective_timeout_s=120.0,
                          **tiers)  # type: ignore[arg-type]  # fmt: skip
    engine = Engine.from_checkpoint(checkpoint, config)
    got = {r.request_id: OutputCollector(r) for r in reqs}
    device = host = tokens = 0
    try:
        start = time.perf_counter()
        for r in reqs:
            engine.add_request(r, got[r.request_id])
        while not all(c.done.is_set() for c in got.values()):
            engine.step()
            ranks = engine.stats().ranks
            if sum(r.sequences for r in ranks) == len(reqs):  # every request held: a snapshot
                held = sum(r.kv_tokens for r in ranks)
                device, host, tokens = (sum(r.device_kv_bytes for r in ranks),
                                        sum(r.kv_bytes for r in ranks), held)  # fmt: skip
        seconds = time.perf_counter() - start
        s = engine.stats()
    finally:
        engine.shutdown()
    outputs = {k: c.result().output_token_ids for k, c in got.items()}
    per = max(tokens, 1)
    return Served(outputs, seconds, s.hisparse_hot_hits, s.hisparse_hot_misses,
                  s.hisparse_h2d_bytes, device / per, host / per)  # fmt: skip


def requests(context: int, n: int, new_tokens: int, vocab: int) -> list[EngineRequest]:
    rng = random.Random(context * 31 + n)
    return [
        EngineRequest(f"c{context}-{i}", tuple(rng.randrange(vocab) for _ in range(context)),
                      SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True))
        for i in range(n)
    ]  # fmt: skip


def run(
    checkpoint: Path, contexts: list[int], concurrency: int, new_tokens: int, rounds: int
) -> list[Row]:
    rows = []
    for context in contexts:
        reqs = requests(context, concurrency, new_tokens, 4000)
        runs: dict[str, list[Served]] = {"off": []} | {name: [] for name in HOT}
        for r in range(rounds):
            for name in runs:
                runs[name].append(serve(checkpoint, reqs, HOT.get(name, 0)))
                print(f"round {r + 1}/{rounds} context {context} {name}: "
                      f"{runs[name][-1].seconds:.2f} s", file=sys.stderr)  # fmt: skip
        out = concurrency * new_tokens
        base = statistics.median(s.seconds for s in runs["off"])
        for name, served in runs.items():
            secs = statistics.median(s.seconds for s in served)
            last = served[-1]
            looked = last.hits + last.misses
            mode = "all rows on the rank" if name == "off" else f"HiSparse, {name}"
            rows.append(Row(
                context, concurrency, mode,
                out / secs, base / secs, last.hits / looked if looked else 0.0,
                last.h2d_bytes / 1024 / out, last.device_per_token, last.host_per_token,
                all(s.outputs == runs["off"][0].outputs for s in served),
            ))  # fmt: skip
    return rows


def main() -> int:
    args = bench_args(__doc__ or "")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = init_tiny_sparse_mla(Path(tmp) / "tiny")
        if args.quick:
            rows = run(checkpoint, [160], 2, 8, 1)
        else:
            rows = run(checkpoint, [1024, 4096], 4, 32, args.rounds)
    columns = [("context", "---:"), ("concurrent", "---:"), ("tiers", "---"),
               ("output tok/s", "---:"), ("vs all rows", "---:"), ("hot hit rate", "---:"),
               ("H2D KiB / output token", "---:"), ("device B / token", "---:"),
               ("host B / token", "---:"), ("identical", "---")]  # fmt: skip

    def cells(r: Row) -> list[str]:
        return [str(r.context), str(r.concurrency), r.mode, f"{r.tokens_per_s:.1f}",
                f"{r.ratio:.2f}×", f"{r.hit_rate:.2f}", f"{r.h2d_kib_per_token:.1f}",
                f"{r.device_bytes_per_token:.0f}", f"{r.host_bytes_per_token:.0f}",
                str(r.identical)]  # fmt: skip

    return report(columns, rows, cells, args.json)


if __name__ == "__main__":
    sys.exit(main())
