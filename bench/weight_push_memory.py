"""The extra memory a trainer's weight push costs each worker: peak resident memory (VmRSS,
sampled every 2 ms) during a push minus just before it, per bucket size, for a `loom up` P/D
fleet of the tiny model in fp64 (~101 MB of weights), next to the push's largest bucket.

Usage:
    .venv/bin/python bench/weight_push_memory.py --out bench/results/weight_push_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from loom_operator.local.state import load_controller, load_or_create_secrets
from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import run_fleet
from loom_runtime.models.tiny import init_tiny
from loom_trainer import PushResult, WeightSync

SAMPLE_S = 0.002
WorkerPids = dict[str, int]


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_during(pids: WorkerPids, run: threading.Thread) -> dict[str, int]:
    """Each worker's peak VmRSS while `run` runs, minus its VmRSS before."""
    base = {n: rss(p) for n, p in pids.items()}
    peak = dict(base)
    run.start()
    while run.is_alive():
        for n, p in pids.items():
            peak[n] = max(peak[n], rss(p))
        time.sleep(SAMPLE_S)
    return {n: peak[n] - base[n] for n in base}


def one_push(
    sync: WeightSync,
    tensors: dict[str, torch.Tensor],
    version: str,
    bucket: int,
    out: list[PushResult],
) -> None:
    out.append(sync.push(tensors, version, mode="barrier", bucket_bytes=bucket))


def measure(bucket_sizes: Sequence[int], root: Path) -> list[dict[str, object]]:
    ckpts = (init_tiny(root / "a", seed=0), init_tiny(root / "b", seed=1))
    env = dict(os.environ, OMP_NUM_THREADS="1", LOOM_CACHE=str(root / "cache"))
    card = root / "card.yaml"
    card.write_text(card_text(f"file://{ckpts[0]}", roles={"prefill": 1, "decode": 1}, name="mem"))
    rows: list[dict[str, object]] = []
    with run_fleet(card, root / "state", env) as fleet:
        info = load_controller(fleet.state)
        assert info is not None
        sync = WeightSync.connect(info.weights_url, load_or_create_secrets(fleet.state).admin_token)
        pids = {w.name: w.pid for w in fleet.wait_settled(120).workers}
        for i, bucket in enumerate(bucket_sizes):
            raw = load_file(str(ckpts[(i + 1) % 2] / "model.safetensors"))
            tensors = {n: t.to(torch.float64) for n, t in raw.items()}
            done: list[PushResult] = []
            version = f"v{i + 2}"
            push = threading.Thread(target=one_push, args=(sync, tensors, version, bucket, done))
            extra = peak_during(pids, push)
            (result,) = done
            rows.append({
                "bucket_bytes": bucket,
                "model_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                "largest_bucket": result.largest_bucket,
                "buckets": result.buckets,
                "peak_rss_increase": extra,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--buckets-mib", default="4,16,64", help="bucket sizes, MiB, comma-separated")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = p.parse_args()
    sizes = [int(x) << 20 for x in args.buckets_mib.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(sizes, Path(tmp))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
