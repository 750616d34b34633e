"""Context parallelism of the sparse-mla family on real gloo ranks, side by side in one run.

For each prompt length it runs the same greedy request (the tiny sparse-mla checkpoint, index
top-k 64) on:
  - one rank (the baseline),
  - PCP2: the prompt split DualChunkSwap-wise over 2 ranks, KV all-gathered per layer,
  - PCP2×DCP2: the same 2 ranks also shard the KV by token (interleave 1) and merge decode
    attention by log-sum-exp (the reference's layout, shrunk to 2 ranks),
and reports prefill seconds (the slowest rank's), PCP2's prefill speed-up over one rank, decode
seconds per step, and DCP's per-step overhead over PCP alone (the reference measured +6 % to
+15 % on H200). A third phase times, on one rank in-process, the indexer's selection and the
sparse attention inside a prefill, and compares where the indexer starts to cost more than the
attention with the capacity planner's FLOP crossover estimate (`indexer_crossover`).

Every figure is the median of --rounds runs. Usage:

    .venv/bin/python bench/context_parallel.py --lengths 2048,4096,8192,16384 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from loom_operator.fleet.capacity import indexer_crossover
from loom_operator.fleet.kv_layout import Indexer, MLAAttention, ModelShape
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
from loom_runtime.models.sparse_mla.loader import load_sparse_mla
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.parallel.ranks import RankConfig, run_ranks
from loom_runtime.parallel.sparse_mla.generate import GenerateRequest, GenerateTrace, generate

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"
LAYOUTS = {
    "1 rank": ParallelLayout(),
    "PCP2": ParallelLayout(pcp=2),
    "PCP2xDCP2": ParallelLayout(pcp=2, dcp=2),
}


@dataclass(frozen=True)
class LayoutRun:
    length: int
    layout: str
    prefill_s: float
    decode_step_s: float
    tokens_equal_one_rank: bool


@dataclass(frozen=True)
class IndexerShare:
    length: int
    prefill_s: float
    indexer_s: float
    attention_s: float

    @property
    def share(self) -> float:
        return self.indexer_s / self.prefill_s


def checkpoint() -> Path:
    target = CACHE / "sparse-mla-tiny"
    if not (target / "config.json").is_file():
        init_tiny_sparse_mla(target)
    return target


def prompt(length: int, vocab: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(vocab, (length,), generator=gen).tolist())


def run_layout(
    ckpt: Path, layout: ParallelLayout, ids: tuple[int, ...], steps: int, workdir: Path
) -> list[GenerateTrace]:
    request = GenerateRequest(
        checkpoint=str(ckpt), prompts=(ids,), decode_steps=steps, layout=layout,
        dtype="float32", all_logits=False,
    )  # fmt: skip
    config = RankConfig(world=layout.world, collective_timeout_s=600.0)
    return run_ranks(config, generate, request, workdir=workdir, timeout_s=3600.0)


def layout_phase(ckpt: Path, lengths: list[int], steps: int, rounds: int) -> list[LayoutRun]:
    vocab = SparseMlaConfig.from_dict(json.loads((ckpt / "config.json").read_text())).vocab_size
    out = []
    for length in lengths:
        samples: dict[str, list[tuple[float, float, bool]]] = {name: [] for name in LAYOUTS}
        for r in range(rounds):
            ids = prompt(length, vocab, seed=r)
            base: tuple[int, ...] | None = None
            for name, layout in LAYOUTS.items():
                with tempfile.TemporaryDirectory() as tmp:
                    traces = run_layout(ckpt, layout, ids, steps, Path(tmp))
                tokens = traces[0].tokens
                base = tokens if base is None else base
                prefill = max(t.prefill_s for t in traces)
                decode = max(t.decode_s for t in traces) / max(1, steps)
                samples[name].append((prefill, decode, tokens == base))
                print(f"  {length:>6} {name:<10} round {r + 1}: prefill {prefill:.2f}s, "
                      f"decode {1e3 * decode:.1f} ms/step", file=sys.stderr)  # fmt: skip
        for name, rows in samples.items():
            out.append(LayoutRun(
                length, name, statistics.median(p for p, _, _ in rows),
                statistics.median(d for _, d, _ in rows), all(ok for _, _, ok in rows),
            ))  # fmt: skip
    return out


def _timed(fn: Callable[..., Any], total: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - start

    return wrapper


def indexer_phase(ckpt: Path, lengths: list[int], rounds: int) -> list[IndexerShare]:
    """One rank in-process: the indexer's selection and the sparse attention, timed inside a
    prefill (instance methods wrapped with a timer; nothing else changes)."""
    loaded = load_sparse_mla(ckpt, torch.float32)
    model = loaded.model
    indexer_s, attention_s = [0.0], [0.0]
    for layer in model.layers:
        if layer.indexer is not None:
            layer.indexer.select = _timed(layer.indexer.select, indexer_s)  # type: ignore[method-assign]
        layer.attention.attend = _timed(layer.attention.attend, attention_s)  # type: ignore[method-assign]
    out = []
    for length in lengths:
        rows = []
        for r in range(rounds):
            ids = torch.tensor(prompt(length, loaded.config.vocab_size, seed=100 + r))
            indexer_s[0] = attention_s[0] = 0.0
            start = time.perf_counter()
            with torch.no_grad():
                model.forward(ids, model.new_cache(length))
            rows.append((time.perf_counter() - start, indexer_s[0], attention_s[0]))
        out.append(IndexerShare(length, *(statistics.median(x[i] for x in rows) for i in range(3))))
        print(f"  {length:>6} indexer {out[-1].indexer_s:.2f}s of {out[-1].prefill_s:.2f}s",
              file=sys.stderr)  # fmt: skip
    return out


def planner_shape(config: SparseMlaConfig) -> ModelShape:
    return ModelShape(
        num_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        attention=MLAAttention(config.kv_lora_rank, config.qk_rope_head_dim),
        kv_dtype="fp32",
        indexer=Indexer(num_layers=len(config.full_indexer_layers), head_dim=config.index_head_dim,
                        top_k=config.index_topk, num_heads=config.index_n_heads),
        mtp_layers=0,
    )  # fmt: skip


def report(runs: list[LayoutRun], shares: list[IndexerShare], crossover: int | None) -> str:
    by = {(r.length, r.layout): r for r in runs}
    lines = [
        "| prompt | 1 rank prefill | PCP2 prefill | PCP2 speed-up | PCP2 decode/step | "
        "PCP2×DCP2 decode/step | DCP overhead | tokens == 1 rank |",
        "|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for length in sorted({r.length for r in runs}):
        one, pcp, both = by[(length, "1 rank")], by[(length, "PCP2")], by[(length, "PCP2xDCP2")]
        same = (
            one.tokens_equal_one_rank and pcp.tokens_equal_one_rank and both.tokens_equal_one_rank
        )
        lines.append(
            f"| {length} | {one.prefill_s:.2f} s | {pcp.prefill_s:.2f} s | "
            f"{one.prefill_s / pcp.prefill_s:.2f}× | {1e3 * pcp.decode_step_s:.1f} ms | "
            f"{1e3 * both.decode_step_s:.1f} ms | "
            f"{100 * (both.decode_step_s / pcp.decode_step_s - 1):+.0f} % | "
            f"{'yes' if same else 'NO'} |"
        )
    lines += ["", "| prompt | prefill (1 rank) | indexer | sparse attention | indexer share |",
              "|---:|---:|---:|---:|---:|"]  # fmt: skip
    measured = next((s.length for s in shares if s.indexer_s > s.attention_s), None)
    for s in shares:
        lines.append(f"| {s.length} | {s.prefill_s:.2f} s | {s.indexer_s:.2f} s | "
                     f"{s.attention_s:.2f} s | {100 * s.share:.0f} % |")  # fmt: skip
    found = measured or "beyond the lengths run"
    lines += ["", f"Indexer costs more than the sparse attention from: measured {found}, "
              f"planner's FLOP estimate {crossover}."]  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="2048,4096,8192,16384")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--quick", action="store_true", help="one short prompt, one round (a smoke)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    lengths = [256] if args.quick else [int(x) for x in args.lengths.split(",")]
    rounds, steps = (1, 4) if args.quick else (args.rounds, args.decode_steps)
    torch.set_num_threads(1)  # each rank one thread: 2 ranks on 2 cores vs 1 rank on 1 core
    ckpt = checkpoint()
    config = SparseMlaConfig.from_dict(json.loads((ckpt / "config.json").read_text()))
    runs = layout_phase(ckpt, lengths, steps, rounds)
    shares = indexer_phase(ckpt, lengths, rounds)
    crossover = indexer_crossover(planner_shape(config), 1)
    print(report(runs, shares, crossover))
    if args.json is not None:
        doc = {"runs": [asdict(r) for r in runs], "shares": [asdict(s) for s in shares],
               "planner_crossover": crossover}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1))
    return 0 if all(r.tokens_equal_one_rank for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
