"""Long contexts (issue #16): each baseline and Loom's feature side by side in one run, as ratios.

Two phases, in-process engines on tiny random-weight models (CPU, float32, one request at a
time):
  - CPU KV offload: the multi-turn agentic trace (`bench/agentic_trace.py`) replayed turn by
    turn through the tiny llama with a device KV pool too small to keep every conversation's
    prefix, with the host tier off (evicted prefixes are recomputed) and on (reloaded).
    Reported: TTFT p50/p90 of each and the on/off ratios, device and host-tier hit tokens, and
    whether every turn's greedy tokens are identical both ways.
  - FP8 vs FP32 KV, tiny llama and tiny sparse-mla: KV bytes per token the engine allocates
    next to the capacity planner's `kv_bytes_per_token` for the same shape, and decode tok/s
    of one request (the CPU path dequantises fp8 rows on gather).
Every timing is the median of --rounds rounds. Progress goes to stderr, tables to stdout.
Usage:

    OMP_NUM_THREADS=1 PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/long_context.py \\
        --json bench/results/long_context.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from agentic_trace import TraceShape, workload
from kv_precision import PrecisionRun, precision_phase
from offload_replay import PoolShape, offload_phase, summarize

from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.models.tiny import init_tiny

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"

# (trace, device pool, precision phase: prompt tokens, decode tokens), full and --quick.
FULL = (
    TraceShape(groups=4, users=3, turns=5, system_tokens=768, user_tokens=64, rate=1.0,
               think_s=1.0),
    PoolShape(num_blocks=96, block_size=16, max_model_len=1280, host_gib=0.25, output_tokens=16),
    (512, 64),
)  # fmt: skip
QUICK = (
    TraceShape(groups=2, users=2, turns=2, system_tokens=128, user_tokens=16, rate=1.0,
               think_s=1.0),
    PoolShape(num_blocks=16, block_size=16, max_model_len=256, host_gib=0.01, output_tokens=4),
    (32, 8),
)  # fmt: skip


def checkpoints(cache: Path) -> dict[str, Path]:
    """The tiny llama and sparse-mla checkpoints, written once under `cache`."""
    llama, sparse = cache / "tiny", cache / "sparse-mla-tiny"
    if not (llama / "config.json").is_file():
        init_tiny(llama, seed=0)
    if not (sparse / "config.json").is_file():
        init_tiny_sparse_mla(sparse)
    return {"llama": llama, "sparse-mla": sparse}


def offload_table(s: dict[str, Any]) -> str:
    off, on = s["off"], s["on"]
    rows = [
        "| offload | TTFT p50 | TTFT p90 | prompt tokens | device hits | host hits | tokens run |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, x in (("off", off), ("on", on)):
        rows.append(
            f"| {name} | {1e3 * x['ttft_p50_s']:.1f} ms | {1e3 * x['ttft_p90_s']:.1f} ms | "
            f"{x['prompt_tokens']:.0f} | {x['device_hit_tokens']:.0f} | "
            f"{x['host_hit_tokens']:.0f} | {x['tokens_run']:.0f} |"
        )
    rows += [
        "",
        f"on/off: TTFT p50 {s['ttft_p50_ratio_on_vs_off']:.2f}×, p90 "
        f"{s['ttft_p90_ratio_on_vs_off']:.2f}× ({s['turns']} turns, median of {s['rounds']} "
        f"rounds); greedy tokens identical: {'yes' if s['greedy_outputs_equal'] else 'NO'}",
    ]
    return "\n".join(rows)


def precision_table(runs: list[PrecisionRun]) -> str:
    rows = [
        "| model | KV | bytes/token (runtime) | planner | equal | decode tok/s | vs fp32 "
        "| tok/s by median ITL | vs fp32 |",
        "|---|---|---:|---:|:---:|---:|---:|---:|---:|",
    ]
    fp32 = {r.model: r for r in runs if r.kv == "fp32"}
    for r in runs:
        base = fp32[r.model]
        rows.append(
            f"| {r.model} | {r.kv} | {r.allocated_bytes_per_token} | "
            f"{r.planner_bytes_per_token} | {'yes' if r.matches_planner else 'NO'} | "
            f"{r.decode_tok_s:.1f} | {r.decode_tok_s / base.decode_tok_s:.2f}× | "
            f"{r.decode_tok_s_itl_p50:.1f} | "
            f"{r.decode_tok_s_itl_p50 / base.decode_tok_s_itl_p50:.2f}× |"
        )
    return "\n".join(rows)


def precision_doc(runs: list[PrecisionRun]) -> list[dict[str, Any]]:
    fp32 = {r.model: r for r in runs if r.kv == "fp32"}
    out = []
    for r in runs:
        base = fp32[r.model]
        out.append({
            **asdict(r),
            "matches_planner": r.matches_planner,
            "bytes_ratio_vs_fp32": r.allocated_bytes_per_token / base.allocated_bytes_per_token,
            "decode_ratio_vs_fp32": r.decode_tok_s / base.decode_tok_s,
            "decode_itl_ratio_vs_fp32": r.decode_tok_s_itl_p50 / base.decode_tok_s_itl_p50,
        })  # fmt: skip
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="median of this many rounds")
    p.add_argument("--quick", action="store_true", help="a tiny trace, one round (a smoke)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--cache", type=Path, default=CACHE, help="where the tiny checkpoints live")
    args = p.parse_args()
    trace, pool, (prompt_tokens, decode_tokens) = QUICK if args.quick else FULL
    rounds = 1 if args.quick else args.rounds
    torch.set_num_threads(1)
    paths = checkpoints(args.cache)
    models: dict[str, LoadedModel] = {n: load_model(x, torch.float32) for n, x in paths.items()}
    print("offload phase (tiny llama, agentic trace)", file=sys.stderr)
    systems, sessions = workload(trace)
    offload = summarize(offload_phase(models["llama"], systems, sessions, pool, rounds))
    print("precision phase (fp32 vs fp8 KV)", file=sys.stderr)
    precision = precision_phase(models, prompt_tokens, decode_tokens, rounds)
    print(offload_table(offload) + "\n\n" + precision_table(precision))
    if args.json is not None:
        doc = {
            "bench": "long_context",
            "command": " ".join(["bench/long_context.py", *sys.argv[1:]]),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "machine": platform.machine(),
            "config": {"trace": asdict(trace), "pool": asdict(pool), "rounds": rounds,
                       "precision_prompt_tokens": prompt_tokens,
                       "precision_decode_tokens": decode_tokens},
            "offload": offload,
            "precision": precision_doc(precision),
        }  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    ok = offload["greedy_outputs_equal"] and all(r.matches_planner for r in precision)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
