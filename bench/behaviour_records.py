"""Behaviour records in the engine's batched step: 16 concurrent sampled requests with the
record off (the baseline) and on (`SamplingParams.behaviour`), side by side in one run.

The tiny checkpoint (random weights, fp32, one intra-op thread) serves N concurrent sampled
requests (24-token prompts, temperature 0.8, top_p 0.95, seeds 0..N-1, a 64-token budget)
through `Engine`, off then on, each round. Reports the median decode step with all N decoding
(ms, thread CPU time), the sampler alone on N rows of the vocabulary (ms, thread CPU time, the
sides interleaved call by call, median of 200 calls: the stable figure on a shared machine),
output tokens/s of the whole run, and checks that both sides drew the same tokens (the record
changes no draw: `identical`). Medians of `--rounds` after a warm-up round. Usage:

    OMP_NUM_THREADS=1 PYTHONPATH=runtime:operator:router:.:trainer .venv/bin/python \\
        bench/behaviour_records.py [--rounds 5] [--quick] [--json PATH]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from side_by_side import bench_args, median_rows, report, serve_timed

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.sampler import make_generator, sample
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import load_model
from loom_runtime.models.tiny import init_tiny


@dataclass(frozen=True)
class Row:
    side: str  # off (baseline) | on
    concurrency: int
    step_ms: float  # median decode step with every request decoding
    sample_ms: float  # the sampler alone on N rows (median of 200 calls)
    tokens_per_s: float  # output tokens / wall time of the whole run
    identical: bool  # the same tokens as the baseline (off: True)


def _requests(tag: str, n: int, sampling: SamplingParams) -> list[EngineRequest]:
    gen = torch.Generator().manual_seed(0)
    prompts = [tuple(int(t) for t in torch.randint(10, 4000, (24,), generator=gen))
               for _ in range(n)]  # fmt: skip
    return [EngineRequest(f"{tag}-{i}", p, replace(sampling, seed=i))
            for i, p in enumerate(prompts)]  # fmt: skip


def _run(engine: Engine, reqs: list[EngineRequest]) -> tuple[list[tuple[int, ...]], float, float]:
    """Serve `reqs` together: their tokens, the median step with all decoding, tokens/s."""
    served = serve_timed(engine, reqs)
    if any(r.sampling.behaviour and len(d.behaviour_logprobs) != len(d.output_token_ids)
           for r, d in zip(reqs, served.done, strict=True)):  # fmt: skip
        raise AssertionError("a record without one log-prob per output token")
    step_ms = 1000 * statistics.median(served.steps[1:])
    return [d.output_token_ids for d in served.done], step_ms, served.tokens / served.wall


def _sample_ms(sides: tuple[SamplingParams, ...], n: int, vocab: int) -> list[float]:
    """The sampler alone on n rows (their own generators) per side, in thread CPU time, the
    sides interleaved call by call; medians of 200 calls."""
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(1))
    gens = [make_generator(i) for i in range(n)]
    times: list[list[float]] = [[] for _ in sides]
    for _ in range(200):
        for params, took in zip(sides, times, strict=True):
            t = time.thread_time()
            sample(logits, [params] * n, gens)
            took.append(time.thread_time() - t)
    return [1000 * statistics.median(took) for took in times]


def _round(engine: Engine, n: int, max_tokens: int, k: int, vocab: int) -> list[Row]:
    base = SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, ignore_eos=True)
    on = replace(base, behaviour=True)
    off_tokens, off_ms, off_tps = _run(engine, _requests(f"off{k}", n, base))
    on_tokens, on_ms, on_tps = _run(engine, _requests(f"on{k}", n, on))
    off_sample, on_sample = _sample_ms((base, on), n, vocab)
    return [
        Row("off (baseline)", n, off_ms, off_sample, off_tps, True),
        Row("on", n, on_ms, on_sample, on_tps, on_tokens == off_tokens),
    ]


def main() -> int:
    args = bench_args(__doc__ or "")
    n, max_tokens, rounds = (4, 12, 1) if args.quick else (16, 64, args.rounds)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_model(init_tiny(Path(tmp) / "tiny"), dtype=torch.float32)
        config = EngineConfig(dtype=torch.float32, max_model_len=512, num_blocks=n * 8 + 16,
                              max_num_seqs=max(16, n))  # fmt: skip
        engine = Engine(loaded, config)
        vocab = loaded.config.vocab_size
        _round(engine, n, max_tokens, -1, vocab)  # warm-up
        rows = median_rows(
            [_round(engine, n, max_tokens, k, vocab) for k in range(rounds)],
            ("step_ms", "sample_ms", "tokens_per_s"),
        )
    columns = [("record", "---"), ("concurrent", "--:"), ("step ms", "--:"),
               ("sampler ms", "--:"), ("tok/s", "--:"), ("same tokens", "---")]  # fmt: skip
    return report(columns, rows, lambda r: [
        r.side, str(r.concurrency), f"{r.step_ms:.2f}", f"{r.sample_ms:.3f}",
        f"{r.tokens_per_s:.0f}",
        "yes" if r.identical else "NO",
    ], args.json)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
