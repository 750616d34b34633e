"""MTP speculation in the engine's batched step against the same engine without it, side by side
in one run.

The tiny sparse-mla checkpoint (random weights, fp32, one intra-op thread) serves N concurrent
greedy requests through `Engine` with MTP off, and with k = 3 drafts per decode step: drafted by
its own MTP layer (random, so almost never accepted: the cost of drafting in vain) and by a
replay drafter that proposes each request's true continuation with probability `alpha` per draft
(a test double of a trained MTP head at a chosen acceptance rate; the MTP layer's rows are still
written every step). Every speculative run's tokens are checked equal to MTP off. Reports the
mean acceptance length (vLLM's), output tokens per second of thread CPU time for the whole run
(prefill included: the MTP layer's rows of every prompt are part of the cost) and the ratio to
MTP off, medians of `--rounds`. Usage:

    PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/mtp_engine.py [--quick] [--json P]
"""

from __future__ import annotations

import functools
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from side_by_side import bench_args, report, serve_together

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.runner import TokenWork
from loom_runtime.engine.spec.mtp_runner import Drafter
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla

K = 3


@dataclass(frozen=True)
class Row:
    concurrency: int
    drafter: str
    acceptance_length: float
    tokens_per_s: float
    ratio: float  # this run's tokens/s over MTP off's
    identical: bool


class ReplayDrafter:
    """Proposes each request's known continuation; each draft is right with probability
    `alpha` (seeded), as a trained drafter of that accuracy would be."""

    def __init__(self, truth: dict[str, tuple[int, ...]], alpha: float, seed: int) -> None:
        self.truth, self.alpha, self.rng = truth, alpha, random.Random(seed)

    def propose(self, works: Sequence[TokenWork]) -> list[tuple[int, ...]]:
        out = []
        for w in works:
            seq = self.truth[w.request_id]
            true = [seq[min(w.start + 1 + j, len(seq) - 1)] for j in range(w.draft_tokens)]
            out.append(tuple(t if self.rng.random() < self.alpha else (t + 1) % 100 for t in true))
        return out


def serve(
    checkpoint: Path, reqs: list[EngineRequest], mtp: int, drafter: Drafter | None
) -> tuple[dict[str, tuple[int, ...]], float, float]:
    """Outputs, mean acceptance length and thread CPU seconds of serving `reqs` together."""
    loaded = _loaded(checkpoint)
    config = EngineConfig(num_blocks=512, max_model_len=1024, max_num_seqs=16,
                          mtp_draft_tokens=mtp)  # fmt: skip
    engine = Engine(loaded, config, drafter=drafter)
    start = time.thread_time()
    outputs = serve_together(engine, reqs)
    seconds = time.thread_time() - start
    spec = engine.stats().spec
    length = 1.0 if spec is None else spec.mean_acceptance_length
    return outputs, length, seconds


@functools.cache
def _loaded(checkpoint: Path) -> LoadedModel:
    return load_model(checkpoint)


Serve = Callable[
    [Path, list[EngineRequest], int, Drafter | None],
    tuple[dict[str, tuple[int, ...]], float, float],
]


def run(serve: Serve, prompt_tokens: int, new_tokens: int, concurrency: list[int],
        alphas: list[float], rounds: int) -> list[Row]:  # fmt: skip
    """Every case at each concurrency through `serve` (the cases alternate each round)."""
    torch.set_num_threads(1)
    checkpoint = init_tiny_sparse_mla(Path(tempfile.mkdtemp()) / "tiny")
    gen = torch.Generator().manual_seed(0)
    rows: list[Row] = []
    for n in concurrency:
        prompts = [tuple(int(t) for t in torch.randint(10, 4000, (prompt_tokens,), generator=gen))
                   for _ in range(n)]  # fmt: skip
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        reqs = [EngineRequest(f"c{n}-{i}", p, params) for i, p in enumerate(prompts)]
        samples: dict[str, list[tuple[float, float, bool]]] = {}
        for r in range(rounds):
            reference, _, plain_s = serve(checkpoint, reqs, 0, None)
            samples.setdefault("none (MTP off)", []).append((1.0, plain_s, True))
            truth = {q.request_id: (*q.prompt_token_ids, *reference[q.request_id]) for q in reqs}
            drafters: dict[str, Drafter | None] = {"MTP layer (random weights)": None}
            for alpha in alphas:
                drafters[f"replay alpha={alpha:g}"] = ReplayDrafter(truth, alpha, seed=r)
            for name, drafter in drafters.items():
                out, length, secs = serve(checkpoint, reqs, K, drafter)
                samples.setdefault(name, []).append((length, secs, out == reference))
                print(f"round {r + 1}/{rounds} n={n} {name}: {length:.2f} tok/step, "
                      f"{secs:.3f} s (off {plain_s:.3f} s)", file=sys.stderr)  # fmt: skip
        total = n * new_tokens
        off = total / statistics.median(s for _, s, _ in samples["none (MTP off)"])
        for name, got in samples.items():
            tps = total / statistics.median(s for _, s, _ in got)
            length = statistics.median(a for a, _, _ in got)
            rows.append(Row(n, name, length, tps, tps / off, all(i for _, _, i in got)))
    return rows


def main_with(doc: str, serve: Serve, quick: tuple[int, int, list[int], list[float]],
              full: tuple[int, int, list[int], list[float]]) -> int:  # fmt: skip
    """Parse the bench's arguments, run the `quick` or `full` (prompt tokens, new tokens,
    concurrencies, alphas) cases through `serve`, print and save the table."""
    args = bench_args(doc)
    rows = run(serve, *quick, 1) if args.quick else run(serve, *full, args.rounds)
    columns = [("concurrent", "---:"), ("drafter", "---"), ("acceptance length", "---:"),
               ("output tok/s", "---:"), ("vs MTP off", "---:"), ("identical", "---")]  # fmt: skip

    def cells(r: Row) -> list[str]:
        return [str(r.concurrency), r.drafter, f"{r.acceptance_length:.2f}",
                f"{r.tokens_per_s:.1f}", f"{r.ratio:.2f}×", str(r.identical)]  # fmt: skip

    return report(columns, rows, cells, args.json)


def main() -> int:
    return main_with(
        __doc__ or "", serve, (64, 8, [2], [0.8]), (256, 48, [1, 4, 8], [0.5, 0.8, 1.0])
    )


if __name__ == "__main__":
    sys.exit(main())
