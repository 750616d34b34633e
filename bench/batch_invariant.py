"""Batch-invariant mode in the engine's batched step: one and N concurrent sampled requests
with torch's own matmuls and attention (the baseline) and with `batch_invariant`
(models/linear.py, models/invariant_attention.py), side by side; and one long prompt's prefill.

The tiny llama checkpoint (random weights, hidden 384, 6 layers), fp32, one intra-op thread,
serves 1 and 16 concurrent sampled requests (24-token prompts, temperature 0.8, seeds 0..N-1,
a 64-token budget, log-probs on) through `Engine`, off then on, each round. Reports the
median decode step with all decoding (ms, thread CPU time), output tokens/s of the whole run,
and whether each request's tokens and log-probs batched are the same bits as the request run alone
(`alone = batched`: what the mode is for; the baseline's answer is reported, not required).
Then a 512-token prompt (`--quick`: 96) prefilled in one step (its CPU time), and whether its
record is the same bits prefilled whole, in 64-token chunks and from the prefix cache.
Medians of `--rounds` after a warm-up round. Usage:

    OMP_NUM_THREADS=1 PYTHONPATH=runtime:operator:router:.:trainer .venv/bin/python \\
        bench/batch_invariant.py [--rounds 5] [--quick] [--json PATH]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from side_by_side import bench_args, median_rows, report, serve_timed

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.tiny import init_tiny

Record = list[tuple[int, float]]  # (token, log-prob) per output token


@dataclass(frozen=True)
class Row:
    side: str  # off (baseline) | on
    concurrency: int
    step_ms: float  # median decode step with every request decoding
    tokens_per_s: float  # output tokens / wall time of the whole run
    alone_equal: bool  # every request's tokens and log-probs batched == alone, bit for bit
    identical: bool  # what the side must show: on, alone_equal; the baseline, nothing


def _requests(tag: str, n: int, max_tokens: int) -> list[EngineRequest]:
    gen = torch.Generator().manual_seed(0)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.8, logprobs=0, ignore_eos=True)
    prompts = [tuple(int(t) for t in torch.randint(10, 4000, (24,), generator=gen))
               for _ in range(n)]  # fmt: skip
    return [EngineRequest(f"{tag}-{i}", p, replace(sampling, seed=i))
            for i, p in enumerate(prompts)]  # fmt: skip


def _run(engine: Engine, reqs: list[EngineRequest]) -> tuple[list[Record], float, float]:
    """Serve `reqs` together: their records, the median step with all decoding, tokens/s."""
    served = serve_timed(engine, reqs)
    records = [[(lp.token_id, lp.logprob) for lp in d.logprobs] for d in served.done]
    step_ms = 1000 * statistics.median(served.steps[1:] or served.steps or [0.0])
    return records, step_ms, served.tokens / served.wall


@dataclass(frozen=True)
class PrefillRow:
    side: str  # off (baseline) | on
    prompt_tokens: int
    prefill_ms: float  # the one step that prefills the whole prompt (thread CPU time)
    chunked_equal: bool  # its record prefilled whole == in 64-token chunks == from the cache
    identical: bool  # on: chunked_equal; the baseline, nothing


def _prefill_side(loaded: LoadedModel, invariant: bool, tokens: int, k: int) -> PrefillRow:
    gen = torch.Generator().manual_seed(1)
    prompt = tuple(int(t) for t in torch.randint(10, 4000, (tokens,), generator=gen))
    sampling = SamplingParams(max_tokens=4, temperature=0.8, seed=0, logprobs=0, ignore_eos=True)

    def engine(budget: int) -> Engine:
        return Engine(loaded, EngineConfig(
            dtype=torch.float32, max_model_len=tokens + 16, num_blocks=2 * tokens // 16 + 8,
            max_num_batched_tokens=budget, batch_invariant=invariant,
        ))  # fmt: skip

    def record(eng: Engine, tag: str) -> tuple[Record, float]:
        served = serve_timed(eng, [EngineRequest(f"prefill-{tag}-{k}-{invariant}", prompt,
                                                 sampling)])  # fmt: skip
        return [(lp.token_id, lp.logprob) for lp in served.done[0].logprobs], served.first_step

    whole_engine, chunked_engine = engine(tokens + 16), engine(64)
    try:
        whole, prefill_s = record(whole_engine, "whole")
        cached, _ = record(whole_engine, "cached")  # the same prompt again: a prefix hit
        chunked, _ = record(chunked_engine, "chunked")
    finally:
        whole_engine.shutdown()
        chunked_engine.shutdown()
    equal = whole == cached == chunked
    side = "on" if invariant else "off (baseline)"
    return PrefillRow(side, tokens, 1000 * prefill_s, equal, equal if invariant else True)


def _side(loaded: LoadedModel, invariant: bool, n: int, max_tokens: int, k: int) -> Row:
    config = EngineConfig(dtype=torch.float32, max_model_len=128, num_blocks=n * 8 + 16,
                          max_num_seqs=max(16, n), batch_invariant=invariant)  # fmt: skip
    engine = Engine(loaded, config)
    try:
        reqs = _requests(f"{'on' if invariant else 'off'}{k}", n, max_tokens)
        batched, step_ms, tps = _run(engine, reqs)
        alone = [_run(engine, [r])[0][0] for r in reqs]
    finally:
        engine.shutdown()
    equal = alone == batched
    side = "on" if invariant else "off (baseline)"
    return Row(side, n, step_ms, tps, equal, equal if invariant else True)


def main() -> int:
    args = bench_args(__doc__ or "")
    n, max_tokens, rounds = (4, 12, 1) if args.quick else (16, 64, args.rounds)
    prompt = 96 if args.quick else 512
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_model(init_tiny(Path(tmp) / "tiny"), dtype=torch.float32)
        _side(loaded, False, n, max_tokens, -1)  # warm-up
        rows = median_rows(
            [
                [_side(loaded, on, c, max_tokens, k) for c in (1, n) for on in (False, True)]
                for k in range(rounds)
            ],
            ("step_ms", "tokens_per_s"),
        )
        prefills = median_rows(
            [[_prefill_side(loaded, on, prompt, k) for on in (False, True)] for k in range(rounds)],
            ("prefill_ms",),
        )
    print(f"{max_tokens} tokens each, median of {rounds} rounds\n")
    columns = [("mode", "---"), ("concurrent", "--:"), ("step ms", "--:"), ("tok/s", "--:"),
               ("alone = batched", "---")]  # fmt: skip
    decode = report(columns, rows, lambda r: [
        r.side, str(r.concurrency), f"{r.step_ms:.2f}", f"{r.tokens_per_s:.0f}",
        "yes" if r.alone_equal else "no",
    ], None)  # fmt: skip
    print()
    columns = [("mode", "---"), ("prompt", "--:"), ("prefill ms", "--:"),
               ("whole = chunked = cached", "---")]  # fmt: skip
    prefill = report(columns, prefills, lambda r: [
        r.side, str(r.prompt_tokens), f"{r.prefill_ms:.1f}", "yes" if r.chunked_equal else "no",
    ], None)  # fmt: skip
    if args.json is not None:
        doc = {"decode": [asdict(r) for r in rows], "prefill": [asdict(r) for r in prefills]}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return decode or prefill


if __name__ == "__main__":
    sys.exit(main())
