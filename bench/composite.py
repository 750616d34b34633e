"""Think-then-draw on one shared MoT instance vs the same two loops as two separate engines.

One MoT checkpoint (the tiny family widened, random weights), on CPU. Two arrangements serve
the same requests, half think-then-draw images and half chats of the same length:

  - shared    one engine built from the card's ModelInstance (serve/program_worker.py), as a
              `loom runtime` worker of the card runs it: the text loop and the denoise lane run
              one model object; an image thinks, then draws attending to the thought's own KV
              blocks (moved to the lane, nothing recomputed)
  - separate  the same two loops as two engines, each loading the checkpoint (its weights twice):
              a writer thinks (and serves the chats); a painter then draws from the prompt and
              the thought, recomputing their text KV in a prefill of its own (it cannot read the
              writer's cache), each engine on its own step thread, as two workers would be

At each concurrency C, a closed loop of C clients keeps C requests in flight until the phase's
requests are done; it reports requests/s and images/s, requests per CPU-second (every thread of
the process: a machine shared with other work distorts it far less than wall time), the resident
memory (VmRSS once loaded and warmed up, the peak VmHWM) and the parameter bytes the loops hold
(each storage once). Each arrangement runs in a process of its own (its memory is its own), both
in every round, one after the other; round 0 warms up and is not counted; the summary is the
median over rounds (of the rates, and of each round's shared ÷ separate ratios). Before timing,
each process runs the parity probe: the same images one at a time; the two arrangements must give
the same thoughts (and the painter's one token must be the thought's last), and the largest
latent difference is reported: in --quick (float64, Loom's CPU decode kernel off: it accumulates
in float32 whatever the dtype, so a thought decoded token by token would differ from the
painter's float64 prefill by ~1e-8) it must be within 1e-12, else within 1e-3. Usage:

    PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/composite.py --rounds 5
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
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from mot_arrangements import Arrangement, Separate, Shared, Workload, closed_loop, make_jobs

from loom_runtime.engine.config import EngineConfig
from loom_runtime.models.mot.tiny import write_mot_checkpoint
from loom_runtime.serve.model_instance import weights_bytes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny-mot.yaml"
ARRANGEMENTS = ("shared", "separate")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
# ----------------------------------------------------------------------------- one process


def memory() -> dict[str, float]:
    """VmRSS (now) and VmHWM (the peak) of this process, MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One arrangement in this process: load, the parity probe, warm up, every C; the JSON."""
    w = Workload(args.think, args.side, args.steps, args.prompt)
    config = EngineConfig(dtype=DTYPES[args.dtype], max_model_len=256, num_blocks=args.blocks)
    arr: Arrangement = (
        Shared(args.card, config, w) if args.child == "shared" else Separate(args.ckpt, config, w)
    )
    for engine in arr.engines:
        engine.start()
    try:
        probe = closed_loop(arr, [j for j in make_jobs(w, 4, "probe", 99) if j.draw], 1)
        closed_loop(arr, make_jobs(w, 8, "warm", 98), 4)
        loaded = memory()
        phases = []
        for c in args.levels:
            jobs = make_jobs(w, max(2 * c, args.min_jobs), f"r{args.round}c{c}", args.round)
            cpu0, t0 = time.process_time(), time.perf_counter()
            closed_loop(arr, jobs, c)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            images = sum(j.draw is not None for j in jobs)
            phases.append({"concurrency": c, "requests": len(jobs), "images": images,
                           "wall_s": wall, "cpu_s": cpu})  # fmt: skip
    finally:
        for engine in arr.engines:
            engine.shutdown()
    return {
        "arrangement": args.child,
        "round": args.round,
        "parameter_bytes": weights_bytes(arr.models()),
        "rss_mib": loaded["VmRSS"],
        "peak_rss_mib": memory()["VmHWM"],
        "phases": phases,
        "probe": {
            rid: {"thought": list(t), "latents": lat.flatten().tolist(), "draw_from": list(first)}
            for rid, (t, lat, first) in probe.items()
            if lat is not None
        },
    }


def run_child(args: argparse.Namespace, arrangement: str, round_: int, tmp: Path) -> Any:
    out = tmp / f"{arrangement}-{round_}.json"
    flags = {"--child": arrangement, "--round": round_, "--child-out": out, "--card": args.card,
             "--ckpt": args.ckpt, "--concurrency": args.concurrency, "--min-jobs": args.min_jobs,
             "--think": args.think, "--side": args.side, "--steps": args.steps,
             "--prompt": args.prompt, "--dtype": args.dtype, "--blocks": args.blocks}  # fmt: skip
    cmd = [sys.executable, __file__, *(str(x) for kv in flags.items() for x in kv)]
    env = dict(os.environ)
    if args.quick:  # decodes on torch's float64 path: the CPU kernel accumulates in float32
        env["LOOM_CPU_KERNELS"] = "0"
    subprocess.run(cmd, check=True, timeout=1800, env=env)
    return json.loads(out.read_text())


# ----------------------------------------------------------------------------- the run


def checkpoint(cache: Path, hidden: int, layers: int) -> tuple[Path, Path]:
    """The MoT checkpoint (the tiny one widened to `hidden` over `layers`; random weights) and
    the example's ModelCard over it."""
    name = f"mot-{hidden}x{layers}"
    path = cache / name
    if not (path / "config.json").exists():
        tmp = cache / f"{name}.tmp"
        heads = max(hidden // 64, 2)
        write_mot_checkpoint(
            tmp, seed=5, num_hidden_layers=layers, hidden_size=hidden,
            intermediate_size=3 * hidden, num_attention_heads=heads,
            num_key_value_heads=heads // 2, head_dim=hidden // heads,
        )  # fmt: skip
        tmp.rename(path)
    card = cache / f"{name}.card.yaml"
    card.write_text(EXAMPLE.read_text().replace("loom://tiny-mot", f"file://{path}"))
    return path, card


def parity(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The probe images of every process against the first shared one: thoughts (and the token
    each draw began with) identical, and the largest latent difference."""
    base = next(r for r in runs if r["arrangement"] == "shared")["probe"]
    identical, worst = True, 0.0
    for run in runs:
        for rid, got in run["probe"].items():
            ref = base[rid]
            identical &= got["thought"] == ref["thought"]
            identical &= got["draw_from"] == ref["thought"][-1:]
            diff = torch.tensor(got["latents"]) - torch.tensor(ref["latents"])
            worst = max(worst, diff.abs().max().item())
    return {"identical_thoughts": identical, "max_latent_diff": worst}


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per C: the medians over rounds of each arrangement's rates and of the shared ÷ separate
    ratio of each round; and the memory medians under "memory"."""
    rates: dict[tuple[int, str, int], dict[str, float]] = {}
    for run in runs:
        for p in run["phases"]:
            rates[p["concurrency"], run["arrangement"], run["round"]] = {
                "requests_per_s": p["requests"] / p["wall_s"],
                "images_per_s": p["images"] / p["wall_s"],
                "requests_per_cpu_s": p["requests"] / p["cpu_s"],
            }
    out: dict[str, dict[str, float]] = {}
    for c in sorted({k[0] for k in rates}):
        rounds = sorted({k[2] for k in rates if k[0] == c})
        med: dict[str, float] = {}
        for arr in ARRANGEMENTS:
            for name in ("requests_per_s", "images_per_s", "requests_per_cpu_s"):
                med[f"{arr}_{name}"] = statistics.median(rates[c, arr, r][name] for r in rounds)
        for ratio, name in (("", "requests_per_s"), ("_cpu", "requests_per_cpu_s")):
            med[f"shared_vs_separate{ratio}"] = statistics.median(
                rates[c, "shared", r][name] / rates[c, "separate", r][name] for r in rounds
            )
        out[str(c)] = med
    memory: dict[str, float] = {}
    for arr in ARRANGEMENTS:
        mine = [r for r in runs if r["arrangement"] == arr]
        for name in ("parameter_bytes", "rss_mib", "peak_rss_mib"):
            memory[f"{arr}_{name}"] = statistics.median(r[name] for r in mine)
    out["memory"] = memory
    return out


def print_table(summary: dict[str, dict[str, float]]) -> None:
    print(
        "\n| C | shared req/s | separate req/s | shared images/s | separate images/s | "
        "**shared ÷ separate** | shared req/CPU-s | separate req/CPU-s | **÷ per CPU-s** |"
    )
    print("|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for c, m in summary.items():
        if c != "memory":
            print(
                f"| {c} | {m['shared_requests_per_s']:.2f} | {m['separate_requests_per_s']:.2f} "
                f"| {m['shared_images_per_s']:.2f} | {m['separate_images_per_s']:.2f} | "
                f"**{m['shared_vs_separate']:.2f}×** | {m['shared_requests_per_cpu_s']:.2f} | "
                f"{m['separate_requests_per_cpu_s']:.2f} | **{m['shared_vs_separate_cpu']:.2f}×** |"
            )
    m = summary["memory"]
    print("\n| arrangement | parameter MB | RSS loaded (MiB) | peak RSS (MiB) |")
    print("|---|---|---|---|")
    for arr in ARRANGEMENTS:
        print(
            f"| {arr} | {m[f'{arr}_parameter_bytes'] / 1e6:.1f} | {m[f'{arr}_rss_mib']:.0f} | "
            f"{m[f'{arr}_peak_rss_mib']:.0f} |"
        )


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated C levels")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (after a warm-up)")
    p.add_argument("--min-jobs", type=int, default=16, help="requests per phase at least")
    p.add_argument("--think", type=int, default=16, help="thought (and chat) tokens")
    p.add_argument("--side", type=int, default=16, help="latent height and width")
    p.add_argument("--steps", type=int, default=4, help="denoise steps")
    p.add_argument("--prompt", type=int, default=24, help="prompt tokens")
    p.add_argument("--hidden", type=int, default=512, help="the MoT's width")
    p.add_argument("--layers", type=int, default=4, help="the MoT's layers")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--blocks", type=int, default=512, help="KV blocks of each engine")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny, float64, C 1,2")
    p.add_argument("--json", type=Path, default=ROOT / "bench/results/composite.json")
    p.add_argument("--cache", type=Path, default=ROOT / ".cache" / "bench")
    # one arrangement in a child process (the parent passes these)
    p.add_argument("--child", choices=ARRANGEMENTS, help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--card", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.rounds, args.min_jobs, args.dtype = "1,2", 1, 2, "float64"
        args.think, args.side, args.steps, args.prompt = 4, 4, 2, 6
        args.hidden, args.layers, args.blocks = 64, 2, 64
    args.levels = [int(c) for c in args.concurrency.split(",")]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        args.child_out.write_text(json.dumps(child(args)))
        return 0
    args.ckpt, args.card = checkpoint(args.cache, args.hidden, args.layers)
    runs = []
    with tempfile.TemporaryDirectory(prefix="loom-composite-") as tmp:
        for r in range(args.rounds + 1):
            got = [run_child(args, arr, r, Path(tmp)) for arr in ARRANGEMENTS]
            runs += got if r else []
            rates = ", ".join(
                f"{g['arrangement']} C={p['concurrency']} {p['requests'] / p['wall_s']:.2f}/s"
                for g in got
                for p in g["phases"]
            )
            print(f"round {r}: {rates}", flush=True)
    summary, check = summarize(runs), parity(runs)
    print_table(summary)
    print(f"\nparity: {check}")
    report = {
        "command": " ".join(["bench/composite.py", *(sys.argv[1:] if argv is None else argv)]),
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average_after": os.getloadavg(),
        "checkpoint": args.ckpt.name,
        "dtype": args.dtype,
        "workload": asdict(Workload(args.think, args.side, args.steps, args.prompt)),
        "parity": check,
        "median": summary,
        "runs": [{k: v for k, v in r.items() if k != "probe"} for r in runs],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    limit = 1e-12 if args.dtype == "float64" else 1e-3
    return 0 if check["identical_thoughts"] and check["max_latent_diff"] <= limit else 1


if __name__ == "__main__":
    sys.exit(main())
