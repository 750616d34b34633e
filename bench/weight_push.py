"""A trainer's weight push vs loading the same weights from a checkpoint, and vs a plain
`torch.distributed` broadcast of the same tensors (#37), for the tiny model (fp64, 101 MB) and
the Qwen2.5-0.5B shape (fp32, 1.98 GB), on a `loom up` P/D fleet (1 prefill + 1 decode)
and, for the push's rate alone, on one aggregated worker.

Per shape:
  1. the baseline: a plain gloo broadcast of the tensors between 2 fresh processes (and among
     1 + 2, the push's world), tensor by tensor and packed in buckets, no fleet running;
  2. quiet pushes (mode barrier, no load) to one aggregated worker (a world of 2, as the
     baseline's) and to the P/D fleet: the push's rate, bytes / (first bucket → commit), over
     the group's broadcasts and over NIXL (each worker READs every bucket; --transports);
  3. under streaming load (C clients streaming greedy completions in a loop), rounds of:
     push barrier, push rolling, push keep (kv keep: the streams go on across the swap),
     checkpoint + Barrier sync, checkpoint + Rolling sync (the checkpoint path writes the
     tensors as a checkpoint directory, then edits the card's source and weightsVersion —
     today's way); --methods picks some of them.
Per update: its time (start → every worker serves the version), bytes/s, the longest gap between
two tokens of a stream and the longest wait for the first token of a request started during the
update (and both in the same window before it), the peak extra RSS of a worker (VmRSS sampled
every 5 ms), failed and mixed streams (a stream that carries two versions: by design under
push keep, whose tokens each carry theirs, a fault under every other method). Medians over the
rounds.

Usage:
    .venv/bin/python bench/weight_push.py --shapes tiny,0.5b --repeats 3 \
        --out bench/results/weight_push.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from broadcast_baseline import Baseline, tensors_of
from broadcast_baseline import measure as broadcast
from engine import checkpoint as bench_checkpoint
from run_record import RunRecord
from safetensors.torch import save_file
from weight_push_report import PeakRss, Update, pause, summarize

from loom_operator.local.state import load_controller, load_or_create_secrets
from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import FleetProcess, run_fleet
from loom_operator.testing.load import StreamingLoad
from loom_runtime.models.tiny import init_tiny
from loom_trainer import WeightSync

ROOT = Path(__file__).resolve().parent.parent

PD = {"prefill": 1, "decode": 1}
ONE = {"aggregated": 1}
"""Quiet pushes also go to one aggregated worker: a world of 2, as the plain broadcast's."""
PROMPTS = tuple(f"Request {i}: a steady stream of words while the weights change" for i in range(8))
METHODS = (
    "push barrier", "push rolling", "push keep", "checkpoint Barrier", "checkpoint Rolling",
)  # fmt: skip
MIXES = "push keep"
"""The one method under which a stream may carry two versions."""
Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Shape:
    name: str
    model: str
    card_dtype: str
    dtype: torch.dtype
    max_tokens: int
    """Tokens per streamed request of the load."""


SHAPES = {
    "tiny": Shape("tiny", "tiny", "fp64", torch.float64, 32),
    "0.5b": Shape("0.5b", "half-b", "fp32", torch.float32, 16),
}


def write_checkpoint(tensors: Tensors, like: Path, out: Path) -> Path:
    """`tensors` as a checkpoint directory: config and tokenizer from `like`."""
    out.mkdir(parents=True)
    for f in like.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / "model.safetensors"))
    return out


def card_of(
    shape: Shape, roles: dict[str, int], source: str, version: int = 1, strategy: str = "Rolling"
) -> str:
    name = "push-" + shape.name.replace(".", "")  # a DNS-1123 label
    return card_text(source, version=f"v{version}", roles=roles, name=name, model=shape.model,
                     strategy=strategy, dtype=shape.card_dtype, drain=60,
                     health_timeout=60.0)  # fmt: skip


def checkpoints(shape: Shape, work: Path) -> Path:
    if shape.name == "tiny":
        return init_tiny(work / "a", seed=0)
    return bench_checkpoint("0.5b")  # the Qwen2.5-0.5B shape bench/engine.py builds


class Bench:
    """One shape's fleet: the two weight sets versions alternate between, and each update."""

    def __init__(
        self, shape: Shape, roles: dict[str, int], fleet: FleetProcess, first: Path, work: Path
    ) -> None:
        self.shape, self.roles, self.fleet, self.first, self.work = shape, roles, fleet, first, work
        a = tensors_of(first, shape.dtype)
        self.tensors = (a, {n: -t for n, t in a.items()})  # v even: a; v odd: every weight negated
        self.bytes = sum(t.numel() * t.element_size() for t in a.values())
        info = load_controller(fleet.state)
        assert info is not None
        token = load_or_create_secrets(fleet.state).admin_token
        self.sync = WeightSync.connect(info.weights_url, token)
        self.pids = [w.pid for w in fleet.wait_settled(600).workers]
        self.version = 1
        self.dirs: list[Path] = []

    def card(self, source: str, version: int, strategy: str) -> str:
        return card_of(self.shape, self.roles, source, version, strategy)

    def update(self, method: str, loaded: bool) -> tuple[Update, float, float]:
        """One update by `method`; (its record without the pause, start, end)."""
        self.version += 1
        tensors = self.tensors[self.version % 2]
        kind, how, *path = method.split()  # "push barrier nixl": over NIXL
        write_s = send_s = 0.0
        with PeakRss(self.pids) as rss:
            t0 = time.monotonic()
            if kind == "push":
                via = path[0] if path else "gloo"
                version = f"v{self.version}"
                result = self.sync.push(tensors, version, mode=how, transport=via)  # type: ignore[arg-type]
                send_s = result.send_s
            else:
                write_s = self._write(tensors)
                self.fleet.edit_card(self.card(f"file://{self.dirs[-1]}", self.version, how))
            self.fleet.wait_settled(600, f"v{self.version}")
            t1 = time.monotonic()
        record = Update(self.shape.name, method, len(self.pids), loaded, f"v{self.version}",
                        t1 - t0, write_s, send_s, self.bytes, rss.extra())  # fmt: skip
        return record, t0, t1

    def _write(self, tensors: Tensors) -> float:
        t0 = time.monotonic()
        self.dirs.append(write_checkpoint(tensors, self.first, self.work / f"v{self.version}"))
        while len(self.dirs) > 2:  # the fleet may still read the previous one
            shutil.rmtree(self.dirs.pop(0), ignore_errors=True)
        return time.monotonic() - t0


def quiet_pushes(
    bench: Bench, repeats: int, transports: Sequence[str], report: Callable[[Update], None]
) -> None:
    for transport in transports:
        method = "push barrier" if transport == "gloo" else f"push barrier {transport}"
        for _ in range(repeats):
            record, _, _ = bench.update(method, loaded=False)
            report(record)


def loaded_updates(
    bench: Bench, args: argparse.Namespace, report: Callable[[Update], None]
) -> None:
    shape = bench.shape
    with StreamingLoad(bench.fleet.endpoint, shape.model, PROMPTS, shape.max_tokens,
                       args.clients) as load:  # fmt: skip
        load.wait_completed(args.clients * 2, 600)
        for _ in range(args.repeats):
            for method in args.methods:
                time.sleep(args.baseline_s)
                record, t0, t1 = bench.update(method, loaded=True)
                time.sleep(args.after_s)
                report(pause(record, list(load.streams), t0, t1, args.baseline_s))


def bench_shape(
    shape: Shape, args: argparse.Namespace, work: Path
) -> tuple[list[Baseline], list[Update]]:
    first = checkpoints(shape, work)
    baselines = [broadcast(first, shape.dtype, world, args.repeats) for world in (2, 3)]
    for b in baselines:
        print(f"  broadcast, {b.world} processes: {b.per_tensor_bps / 1e6:.0f} MB/s tensor by "
              f"tensor, {b.packed_bps / 1e6:.0f} MB/s packed", flush=True)  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOOM_CACHE": str(work / "cache")}
    card = work / "card.yaml"
    updates: list[Update] = []

    def report(u: Update) -> None:
        updates.append(u)
        print(f"  {u.workers} worker(s) {u.method:<18} {'loaded' if u.loaded else 'quiet':<6} "
              f"{u.seconds:6.2f}s  "
              f"send {u.send_s:5.2f}s  gap {u.longest_gap_s:5.2f}s  wait {u.longest_wait_s:5.2f}s  "
              f"rss +{u.peak_extra_rss / 1e6:6.1f} MB  failed {u.failed} mixed {u.mixed}",
              flush=True)  # fmt: skip

    for roles in (ONE, PD):
        card.write_text(card_of(shape, roles, f"file://{first}"))
        state = work / f"state-{len(roles)}"
        with (
            tempfile.TemporaryDirectory(dir=work) as ckpts,
            run_fleet(card, state, env, ready_timeout=600) as fleet,
        ):
            bench = Bench(shape, roles, fleet, first, Path(ckpts))
            quiet_pushes(bench, args.repeats, args.transports, report)
            if roles == PD and not args.quiet_only:
                loaded_updates(bench, args, report)
    return baselines, updates


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="tiny,0.5b")
    p.add_argument("--repeats", type=int, default=3, help="rounds per method (medians kept)")
    p.add_argument("--clients", type=int, default=2, help="streaming clients during updates")
    p.add_argument("--baseline-s", type=float, default=3.0, help="quiet window before each")
    p.add_argument("--after-s", type=float, default=2.0, help="wait after each update")
    p.add_argument(
        "--quiet-only",
        action="store_true",
        help="only the baselines and the quiet pushes (the push's rate), no load",
    )
    p.add_argument("--methods", default=",".join(METHODS), help="the loaded rounds' methods")
    p.add_argument("--transports", default="gloo,nixl", help="the quiet pushes' data paths")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/weight_push.json")
    args = p.parse_args(argv)
    args.methods = args.methods.split(",")
    args.transports = args.transports.split(",")
    if set(args.transports) - {"gloo", "nixl"}:
        p.error(f"--transports takes gloo and nixl, got {args.transports}")
    unknown = set(args.methods) - set(METHODS)
    if unknown:
        p.error(f"unknown --methods {', '.join(sorted(unknown))}; choose from {', '.join(METHODS)}")
    record = RunRecord("weight_push")
    baselines: list[Baseline] = []
    updates: list[Update] = []
    for name in args.shapes.split(","):
        print(f"{name}:", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"loom-bench-push-{name}-") as tmp:
            b, u = bench_shape(SHAPES[name], args, Path(tmp))
        baselines += b
        updates += u
    summary = summarize(baselines, updates)
    print(summary)
    record.write(
        args.out,
        baselines=[{**asdict(b), "best_bps": b.best_bps} for b in baselines],
        updates=[asdict(u) for u in updates],
        summary=summary,
    )
    return 1 if any(u.failed or (u.mixed and u.method != MIXES) for u in updates) else 0


if __name__ == "__main__":
    sys.exit(main())
