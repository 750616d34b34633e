"""One batch-16 decode step of the tiny model through the model runner, timed in thread CPU time.

A micro-benchmark for the decode attention: 16 sequences with the context lengths of
bench/engine.py's concurrent phase (prompts 64..512 tokens plus 32 decoded), their blocks
scattered over the cache as after churn, fp32, one intra-op thread. Thread CPU time (not wall
time) so that a machine shared with other work still gives comparable figures. Usage:

    .venv/bin/python bench/decode_step.py [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
from pathlib import Path

import torch

from loom_runtime.engine.runner import ModelRunner, TokenWork
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.models.loader import load_model
from loom_runtime.models.tiny import init_tiny

BLOCK_SIZE = 16


def context_lengths(n: int = 16, decoded: int = 32) -> list[int]:
    """bench/engine.py's tiny prompt lengths (64..512) plus `decoded` generated tokens."""
    return [64 + (i * 7919) % (512 - 64 + 1) + decoded for i in range(n)]


def build(ckpt: Path) -> tuple[ModelRunner, list[TokenWork]]:
    loaded = load_model(ckpt, dtype=torch.float32)
    lens = context_lengths()
    need = [-(-(n + 1) // BLOCK_SIZE) for n in lens]
    num_blocks = sum(need) + 64
    cache = PagedKVCache(loaded.config.kv_spec(BLOCK_SIZE, num_blocks, torch.float32))
    cache.data.normal_(generator=torch.Generator().manual_seed(0))
    order = torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(1)).tolist()
    works, at = [], 0
    for i, (n, blocks) in enumerate(zip(lens, need, strict=True)):
        table = BlockTable(block_ids=[b + 1 for b in order[at : at + blocks]])
        works.append(TokenWork(f"r{i}", (100 + i,), n, table, want_logits=True))
        at += blocks
    return ModelRunner(loaded.model, cache), works


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps timed per round")
    parser.add_argument("--profile", action="store_true", help="also print torch's op profile")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ckpt = Path(tempfile.mkdtemp()) / "tiny"
    init_tiny(ckpt, seed=0)
    runner, works = build(ckpt)
    for _ in range(3):
        runner.execute(works)
    timer = timeit.Timer(lambda: runner.execute(works), timer=time.thread_time)
    per_step = [timer.timeit(number=args.steps) / args.steps for _ in range(args.rounds)]
    lens = context_lengths()
    print(
        f"batch-16 decode step (contexts {min(lens)}..{max(lens)}), thread CPU time: "
        f"median {statistics.median(per_step) * 1e3:.1f} ms, min {min(per_step) * 1e3:.1f} ms"
    )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                runner.execute(works)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
