"""Loom's DiffusionEngine vs the same requests one by one vs diffusers' `WanPipeline`, side by side.

On one Wan checkpoint (the tiny one of `loom model init-tiny --family dit`, or a wider DiT over
it), float32, classifier-free guidance on; the three engines get the same jobs, with prompts and
seeds drawn afresh each round (Loom's text-feature cache is off). Workloads:
**image** (one frame) and **video** (several frames). At each concurrency C, a closed loop of C
clients keeps C jobs in flight until the phase's jobs are done (a job's latency is its own:
submitted → its frames out), for three engines on the same jobs:

  - loom        the DiffusionEngine on its step thread: every running job's denoise step in one
                batched DiT forward (guidance rows included), the step's same-shaped VAE
                decode chunks in one decoder call, its default step budget
  - one-by-one  the same engine with max_running 1: the same jobs run one after another
  - diffusers   WanPipeline, static batches of C same-shaped jobs (one pipeline call each,
                per-job generators), the best a request-level batcher does

and reports jobs/s (images/s, video jobs/s), jobs per CPU-second (all of this process's threads:
a machine shared with other work distorts it far less than wall time), p50/p90 job latency, the
step-batching gain (loom ÷ one-by-one), loom ÷ diffusers, and Loom's fitted denoise and VAE
decode costs. Each round runs the three engines back to back at each C; round 0 is a warm-up and
is not counted; the summary is the median over rounds (of the rates, and of each round's
ratios). Usage:

    .venv/bin/python bench/diffusion.py --rounds 5   # ~8 min on 2 cores; --quick: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from loom_runtime.diffusion.engine import DiffusionEngine
from loom_runtime.diffusion.engine_types import DiffusionEngineConfig
from loom_runtime.diffusion.types import DiffusionOutput, DiffusionRequest
from loom_runtime.models.wan.config import WanDitConfig
from loom_runtime.models.wan.dit import WanDiT
from loom_runtime.models.wan.loader import LoadedWan, load_wan
from loom_runtime.models.wan.tiny import (
    DIFFUSERS_WEIGHTS,
    init_tiny_wan,
    random_tensors,
    transformer_config,
)
from loom_runtime.testing.wan_reference import reference_embeds, wan_pipeline

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"
TEXT_LEN = 32
GUIDANCE = 5.0  # Wan's default
ENGINES = ("loom", "one-by-one", "diffusers")


@dataclass(frozen=True)
class Workload:
    name: str  # image | video
    width: int
    height: int
    frames: int
    steps: int


@dataclass(frozen=True)
class PhaseResult:
    round: int
    engine: str
    workload: str
    concurrency: int
    jobs: int
    wall_s: float
    cpu_s: float
    latencies_s: tuple[float, ...]

    def rates(self) -> dict[str, float]:
        """Jobs per second and per CPU-second, and the p50 and p90 job latency (deciles)."""
        deciles = statistics.quantiles(self.latencies_s, n=10, method="inclusive")
        return {
            "jobs_per_s": self.jobs / self.wall_s,
            "jobs_per_cpu_s": self.jobs / self.cpu_s,
            "p50_s": statistics.median(self.latencies_s),
            "p90_s": deciles[-1],
        }


# ----------------------------------------------------------------------------- checkpoint


def checkpoint(cache: Path, width: int, layers: int) -> Path:
    """The tiny Wan checkpoint; with `width` > 0, its DiT widened to `width` heads of 16 over
    `layers` blocks (random weights, the same encoder, VAE and tokenizer)."""
    name = "wan-tiny" if width == 0 else f"wan-dit{width}x{layers}"
    path = cache / name
    if (path / "model_index.json").exists():
        return path
    tmp = cache / f"{name}.tmp"
    init_tiny_wan(tmp)
    if width:
        raw = {**transformer_config(), "num_attention_heads": width // 16, "num_layers": layers,
               "ffn_dim": 4 * width}  # fmt: skip
        folder = tmp / "transformer"
        (folder / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        dit = WanDiT(WanDitConfig.from_dict(raw))
        shapes = {name: tuple(t.shape) for name, t in dit.targets().items()}
        save_file(random_tensors(shapes, seed=7), str(folder / DIFFUSERS_WEIGHTS), {"format": "pt"})
    tmp.rename(path)
    return path


# ----------------------------------------------------------------------------- jobs


def make_jobs(w: Workload, n: int, tag: str, seed: int) -> list[DiffusionRequest]:
    """n guided jobs with prompts no other job has (the text cache gives nothing away)."""
    gen = torch.Generator().manual_seed(seed)
    jobs = []
    for i in range(n):
        prompt = tuple(int(t) for t in torch.randint(10, 4000, (12,), generator=gen))
        negative = tuple(int(t) for t in torch.randint(10, 4000, (6,), generator=gen))
        job = DiffusionRequest(
            f"{tag}-{w.name}-{i}", prompt, height=w.height, width=w.width,
            num_frames=w.frames, num_steps=w.steps, guidance_scale=GUIDANCE,
            negative_ids=negative, seed=seed * 1000 + i,
        )  # fmt: skip
        jobs.append(job)
    return jobs


def closed_loop(engine: DiffusionEngine, jobs: Sequence[DiffusionRequest], c: int) -> list[float]:
    """C jobs in flight until all are done; each job's latency, submit → output."""
    done: queue.Queue[tuple[DiffusionOutput, float]] = queue.Queue()
    submitted: dict[str, float] = {}
    pending = iter(jobs)

    def submit() -> None:
        req = next(pending, None)
        if req is not None:
            submitted[req.request_id] = time.perf_counter()
            engine.add_request(req, lambda out: done.put((out, time.perf_counter())))

    for _ in range(c):
        submit()
    latencies = []
    for _ in jobs:
        out, at = done.get(timeout=3600)
        if out.finish_reason != "done":
            raise RuntimeError(f"job {out.request_id} finished with {out.finish_reason}")
        latencies.append(at - submitted[out.request_id])
        submit()
    return latencies


def diffusers_batches(pipe: Any, jobs: Sequence[DiffusionRequest], c: int) -> list[float]:
    """Static batches of C jobs, one pipeline call each (prompt encoding included)."""
    latencies: list[float] = []
    for at in range(0, len(jobs), c):
        batch = jobs[at : at + c]
        t0 = time.perf_counter()
        embeds = torch.cat([reference_embeds(pipe, r.prompt_ids, TEXT_LEN) for r in batch])
        negative = torch.cat([reference_embeds(pipe, r.negative_ids, TEXT_LEN) for r in batch])
        r0 = batch[0]
        pipe(
            prompt_embeds=embeds, negative_prompt_embeds=negative, height=r0.height,
            width=r0.width, num_frames=r0.num_frames, num_inference_steps=r0.num_steps,
            guidance_scale=r0.guidance_scale, output_type="np",
            generator=[torch.Generator().manual_seed(r.seed) for r in batch],
        )  # fmt: skip
        latencies += [time.perf_counter() - t0] * len(batch)
    return latencies


# ----------------------------------------------------------------------------- driver


@dataclass
class Engines:
    loom: DiffusionEngine
    one_by_one: DiffusionEngine
    pipe: Any

    @classmethod
    def start(cls, ckpt: Path, max_running: int) -> Engines:
        loaded: LoadedWan = load_wan(ckpt, dtype=torch.float32)

        def engine(running: int) -> DiffusionEngine:
            e = DiffusionEngine(
                loaded,
                DiffusionEngineConfig(
                    model_name="bench", text_len=TEXT_LEN, max_running=running,
                    max_waiting=4 * max_running, memory_budget_bytes=64 << 30,
                    text_cache_entries=0, idle_wait_s=0.05,
                ),
            )  # fmt: skip
            e.start()
            return e

        return cls(engine(max_running), engine(1), wan_pipeline(ckpt, torch.float32))

    def stop(self) -> None:
        self.loom.shutdown()
        self.one_by_one.shutdown()

    def phase(
        self, round_: int, engine: str, w: Workload, c: int, jobs: list[DiffusionRequest]
    ) -> PhaseResult:
        cpu0, t0 = time.process_time(), time.perf_counter()
        if engine == "diffusers":
            latencies = diffusers_batches(self.pipe, jobs, c)
        else:
            latencies = closed_loop(self.loom if engine == "loom" else self.one_by_one, jobs, c)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        return PhaseResult(round_, engine, w.name, c, len(jobs), wall, cpu, tuple(latencies))


def cost_fits(engine: DiffusionEngine, w: Workload) -> dict[str, dict[str, float]]:
    """What Loom's step cost model learnt of one denoise forward of this workload's latents and
    of one VAE decode call of its latent frames (items: rows, videos)."""
    s = engine.shape
    frames = (w.frames - 1) // s.temporal_scale + 1
    h, w_ = w.height // s.spatial_scale, w.width // s.spatial_scale
    return {
        "denoise": asdict(engine.costs.cost("denoise", (1, s.latent_channels, frames, h, w_))),
        "vae_decode": asdict(engine.costs.cost("vae_decode", (1, s.latent_channels, 1, h, w_))),
    }


def run(
    ckpt: Path, workloads: Sequence[Workload], levels: Sequence[int], min_jobs: int, rounds: int
) -> tuple[list[PhaseResult], dict[str, dict[str, dict[str, float]]]]:
    """Round 0 warms up (not counted); each C runs max(C, min_jobs) jobs per engine. Returns the
    phases and, per workload, Loom's fitted denoise and VAE decode costs."""
    engines = Engines.start(ckpt, max(levels))
    results: list[PhaseResult] = []
    try:
        for r in range(rounds + 1):
            for w in workloads:
                for c in levels:
                    got = [
                        engines.phase(
                            r, name, w, c, make_jobs(w, max(c, min_jobs), f"{name}-{r}", r)
                        )
                        for name in ENGINES
                    ]
                    results += got if r else []
                    rates = ", ".join(f"{p.engine} {p.rates()['jobs_per_s']:.2f}/s" for p in got)
                    print(f"round {r} {w.name} C={c}: {rates}", flush=True)
        fits = {w.name: cost_fits(engines.loom, w) for w in workloads}
    finally:
        engines.stop()
    return results, fits


def summarize(results: list[PhaseResult]) -> dict[str, dict[str, float]]:
    """Medians per workload × concurrency × engine, and the medians of loom's per-round ratios
    to the other two (a round's three engines ran back to back: the ratio cancels most of a
    shared machine's drift)."""
    out: dict[str, dict[str, float]] = {}
    for key in sorted({(p.workload, p.concurrency) for p in results}):
        rows = {
            (p.round, p.engine): p.rates() for p in results if (p.workload, p.concurrency) == key
        }
        rounds = sorted({r for r, _ in rows})
        med: dict[str, float] = {}
        for engine in ENGINES:
            for name in rows[rounds[0], engine]:
                med[f"{engine}_{name}"] = statistics.median(rows[r, engine][name] for r in rounds)
        for ratio, other in (("batching_gain", "one-by-one"), ("vs_diffusers", "diffusers")):
            med[ratio] = statistics.median(
                rows[r, "loom"]["jobs_per_s"] / rows[r, other]["jobs_per_s"] for r in rounds
            )
        out[f"{key[0]}@{key[1]}"] = med
    return out


def print_table(summary: dict[str, dict[str, float]]) -> None:
    print("\n| workload | C | engine | jobs/s | jobs/CPU-s | p50 / p90 latency (s) |")
    print("|---|---|---|---|---|---|")
    for key, med in summary.items():
        workload, c = key.split("@")
        for engine in ENGINES:
            print(
                f"| {workload} | {c} | {engine} | {med[f'{engine}_jobs_per_s']:.2f} | "
                f"{med[f'{engine}_jobs_per_cpu_s']:.2f} | {med[f'{engine}_p50_s']:.2f} / "
                f"{med[f'{engine}_p90_s']:.2f} |"
            )
        print(
            f"| {workload} | {c} | **gain** | batching **{med['batching_gain']:.2f}×**, "
            f"vs diffusers **{med['vs_diffusers']:.2f}×** | | |"
        )


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated C levels")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (after a warm-up)")
    p.add_argument("--min-jobs", type=int, default=4, help="jobs per phase at least (default 4)")
    p.add_argument("--image", default="128x128x1x20", help="WxHxFRAMESxSTEPS of the image jobs")
    p.add_argument("--video", default="64x64x9x20", help="WxHxFRAMESxSTEPS of the video jobs")
    p.add_argument("--dit-width", type=int, default=256, help="the DiT's width (0: the tiny one)")
    p.add_argument("--dit-layers", type=int, default=4, help="the DiT's blocks (with a width)")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, C 1,2, 1 round")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/diffusion.json")
    p.add_argument("--cache", type=Path, default=CACHE, help="where checkpoints are written")
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.rounds, args.min_jobs = "1,2", 1, 2
        args.image, args.video, args.dit_width = "32x32x1x2", "32x32x5x2", 0
    return args


def workload(name: str, spec: str) -> Workload:
    width, height, frames, steps = (int(x) for x in spec.split("x"))
    return Workload(name, width, height, frames, steps)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    workloads = [workload("image", args.image), workload("video", args.video)]
    levels = [int(c) for c in args.concurrency.split(",")]
    ckpt = checkpoint(args.cache, args.dit_width, args.dit_layers)
    results, fits = run(ckpt, workloads, levels, args.min_jobs, args.rounds)
    summary = summarize(results)
    report = {
        "command": " ".join(["bench/diffusion.py", *(sys.argv[1:] if argv is None else argv)]),
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "checkpoint": ckpt.name,
        "workloads": [asdict(w) for w in workloads],
        "median": summary,
        "loom_denoise_cost": {name: fit["denoise"] for name, fit in fits.items()},
        "loom_vae_decode_cost": {name: fit["vae_decode"] for name, fit in fits.items()},
        "runs": [{**asdict(p), **p.rates()} for p in results],
    }
    print_table(summary)
    for name, fit in fits.items():
        fixed, per_row = fit["denoise"]["fixed_s"] * 1e3, fit["denoise"]["per_item_s"] * 1e3
        print(f"Loom's fitted {name} denoise forward: {fixed:.1f} ms + {per_row:.2f} ms/row")
        fixed, per_video = (fit["vae_decode"][k] * 1e3 for k in ("fixed_s", "per_item_s"))
        print(f"Loom's fitted {name} VAE decode call: {fixed:.1f} ms + {per_video:.2f} ms/video")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
