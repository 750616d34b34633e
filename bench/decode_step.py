"""One batch-16 decode step of the tiny model through the model runner, timed in thread CPU time.

A micro-benchmark for the decode attention: 16 sequences with the context lengths of
bench/engine.py's concurrent phase (prompts 64..512 tokens plus 32 decoded), their blocks
scattered over the cache as after churn, fp32, one intra-op thread. Thread CPU time (not wall
time) so that a machine shared with other work still gives comparable figures. By default it
times both decode-attention paths, each in its own process and alternating: the torch path
(`LOOM_CPU_KERNELS=0`: gather K/V, one SDPA call per sequence) and Loom's CPU kernel (the pool
read in place, loom_runtime/kernels). Usage:

    .venv/bin/python bench/decode_step.py [--pairs 3]    # both paths, alternating
    .venv/bin/python bench/decode_step.py --path kernel --profile   # one path, torch's profile
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import torch

from loom_runtime import kernels
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


def time_one_path(rounds: int, steps: int, profile: bool) -> tuple[list[float], list[int]]:
    """Seconds per step of each round on the decode-attention path this process has, and the
    step's greedy tokens (the same on both paths)."""
    torch.set_num_threads(1)
    ckpt = Path(tempfile.mkdtemp()) / "tiny"
    init_tiny(ckpt, seed=0)
    runner, works = build(ckpt)
    logits = runner.execute(works)
    tokens = [int(row.argmax()) for row in logits if row is not None]
    for _ in range(2):
        runner.execute(works)
    timer = timeit.Timer(lambda: runner.execute(works), timer=time.thread_time)
    per_step = [timer.timeit(number=steps) / steps for _ in range(rounds)]
    if profile:
        from torch import profiler

        with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                runner.execute(works)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return per_step, tokens


def run_path(path: str, rounds: int, steps: int) -> dict[str, Any]:
    """One process on `path` (the torch path: LOOM_CPU_KERNELS=0); what it measured."""
    env = {**os.environ, kernels.DISABLE_ENV: "0" if path == "torch" else "1"}
    cmd = [sys.executable, __file__, "--path", path, "--rounds", str(rounds), "--steps", str(steps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["path"] != path:
        raise RuntimeError(f"asked for the {path} path, ran {result['path']}: {done.stderr}")
    return result


def compare(pairs: int, rounds: int, steps: int) -> dict[str, Any]:
    """`pairs` processes per path, alternating torch, kernel, torch, ..."""
    runs: dict[str, list[dict[str, Any]]] = {"torch": [], "kernel": []}
    for _ in range(pairs):
        for path, done in runs.items():
            done.append(run_path(path, rounds, steps))
    med = {path: statistics.median(r["median_ms"] for r in done) for path, done in runs.items()}
    return {
        "contexts": context_lengths(),
        "median_ms": med,
        "per_process_ms": {path: [r["median_ms"] for r in done] for path, done in runs.items()},
        "kernel_over_torch": med["kernel"] / med["torch"],
        "identical_tokens": len({tuple(r["tokens"]) for done in runs.values() for r in done}) == 1,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="torch/kernel process pairs")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps timed per round")
    parser.add_argument("--quick", action="store_true", help="one pair, one round of 2 steps")
    parser.add_argument("--json", type=Path, help="also write the comparison here")
    parser.add_argument("--path", choices=("torch", "kernel"), help="time one path (a child)")
    parser.add_argument("--profile", action="store_true", help="with --path: torch's op profile")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.rounds, args.steps = 1, 1, 2
    if args.path is not None:
        per_step, tokens = time_one_path(args.rounds, args.steps, args.profile)
        ran = "kernel" if kernels.available() else "torch"
        median_ms = statistics.median(per_step) * 1e3
        print(json.dumps({"path": ran, "median_ms": median_ms, "tokens": tokens}))
        return 0
    doc = compare(args.pairs, args.rounds, args.steps)
    lens = doc["contexts"]
    print(f"batch-16 decode step (contexts {min(lens)}..{max(lens)}), thread CPU time, ms:")
    for path, ms in doc["per_process_ms"].items():
        each = ", ".join(f"{m:.1f}" for m in ms)
        print(f"  {path:<7} median {doc['median_ms'][path]:.1f}  (per process: {each})")
    print(f"  kernel / torch: {doc['kernel_over_torch']:.2f}x the time; ", end="")
    print("identical tokens" if doc["identical_tokens"] else "TOKENS DIFFER")
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if doc["identical_tokens"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
