"""What mirroring a parallel engine's rows costs, and what its prefix cache gives back, side by
side in one run.

A PCP2×DCP2 engine of the tiny sparse-mla checkpoint (fp32, gloo ranks) serves the same turns
three ways: without prefix caching (the ranks keep the rows, the engine's pool only counts
blocks: the baseline), with prefix caching (every step's new rows are copied from the ranks
into the engine's own pool over their pipes), and the same with a repeated prefix (the second
turn of each pair is admitted with its prefix cached, and the ranks are seeded from the pool
instead of recomputing it). Reports wall seconds per turn and the ratio to the baseline,
medians of --rounds; every run's tokens are checked equal to the baseline's. Usage:

    PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/ranked_mirror.py [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from side_by_side import bench_args, report

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import SamplingParams
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.parallel.layout import ParallelLayout


@dataclass(frozen=True)
class Row:
    case: str
    prompt_tokens: int
    seconds_per_turn: float
    ratio: float  # this case's seconds per turn over the baseline's
    cached_tokens: int  # prompt tokens served from the prefix cache, over all turns
    identical: bool


def turns(prompt_tokens: int, pairs: int, shared: bool) -> list[tuple[int, ...]]:
    """`pairs` pairs of prompts; with `shared`, both prompts of a pair share all but 16 tokens."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(pairs):
        head = [int(t) for t in torch.randint(10, 4000, (prompt_tokens - 16,), generator=gen)]
        for _ in range(2):
            tail = [int(t) for t in torch.randint(10, 4000, (16,), generator=gen)]
            first = head if shared else [int(t) for t in torch.randint(10, 4000, (len(head),),
                                                                       generator=gen)]  # fmt: skip
            out.append(tuple(first + tail))
    return out


def serve(ckpt: Path, prompts: list[tuple[int, ...]], caching: bool, new_tokens: int
          ) -> tuple[list[tuple[int, ...]], float, int]:  # fmt: skip
    """Tokens, wall seconds per turn and cached prompt tokens of serving the turns in order."""
    layout = ParallelLayout(pcp=2, dcp=2)
    config = EngineConfig(num_blocks=512, max_model_len=4096, max_num_batched_tokens=4096,
                          parallel=layout, prefix_caching=caching)  # fmt: skip
    engine = Engine.from_checkpoint(ckpt, config)
    try:
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        engine.generate(tuple(range(5, 37)), params)  # warm the ranks (shares no block)
        start = time.perf_counter()
        done = [engine.generate(p, params) for p in prompts]
        seconds = (time.perf_counter() - start) / len(prompts)
    finally:
        engine.shutdown()
    return [d.output_token_ids for d in done], seconds, sum(d.num_cached_tokens for d in done)


def run(lengths: list[int], pairs: int, new_tokens: int, rounds: int) -> list[Row]:
    torch.set_num_threads(1)
    ckpt = init_tiny_sparse_mla(Path(tempfile.mkdtemp()) / "tiny")
    rows: list[Row] = []
    for n in lengths:
        cases = {
            "no prefix caching (baseline)": (turns(n, pairs, shared=False), False),
            "prefix caching, no shared prefix (mirror cost)": (turns(n, pairs, False), True),
            "no prefix caching, shared prefixes": (turns(n, pairs, shared=True), False),
            "prefix caching, shared prefixes (seeded)": (turns(n, pairs, shared=True), True),
        }
        got: dict[str, list[tuple[float, int, bool]]] = {}
        for r in range(rounds):
            reference: dict[bool, list[tuple[int, ...]]] = {}
            for name, (prompts, caching) in cases.items():
                shared = "shared" in name and "no shared" not in name
                tokens, secs, cached = serve(ckpt, prompts, caching, new_tokens)
                same = reference.setdefault(shared, tokens) == tokens
                got.setdefault(name, []).append((secs, cached, same))
                print(f"round {r + 1}/{rounds} {n} tokens, {name}: {secs:.3f} s/turn, "
                      f"{cached} cached", file=sys.stderr)  # fmt: skip
        base = {
            False: statistics.median(s for s, _, _ in got["no prefix caching (baseline)"]),
            True: statistics.median(s for s, _, _ in got["no prefix caching, shared prefixes"]),
        }
        for name, samples in got.items():
            shared = "shared" in name and "no shared" not in name
            secs = statistics.median(s for s, _, _ in samples)
            cached = samples[0][1]
            rows.append(Row(name, n, secs, secs / base[shared], cached,
                            all(i for _, _, i in samples)))  # fmt: skip
    return rows


def main() -> int:
    args = bench_args(__doc__)
    rows = run([96], 1, 2, 1) if args.quick else run([512, 2048], 2, 16, args.rounds)
    columns = [("prompt", "---:"), ("case", "---"), ("s/turn", "---:"), ("vs no caching", "---:"),
               ("cached tokens", "---:"), ("identical", "---")]  # fmt: skip

    def cells(r: Row) -> list[str]:
        return [str(r.prompt_tokens), r.case, f"{r.seconds_per_turn:.3f}", f"{r.ratio:.2f}×",
                str(r.cached_tokens), str(r.identical)]  # fmt: skip

    return report(columns, rows, cells, args.json)


if __name__ == "__main__":
    sys.exit(main())
