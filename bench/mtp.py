"""MTP speculative decoding against plain greedy decoding, one sequence, side by side in one run.

The tiny sparse-mla checkpoint (random weights, fp32, one intra-op thread) decodes the same
prompt plainly (one trunk forward per token) and speculatively with k drafts per step: with its
own MTP layer (random, so it is almost never right: the cost of drafting in vain) and with a
replay drafter that proposes the true greedy continuation with probability `alpha` per draft (a
test double of a trained MTP head at a chosen acceptance rate). Every speculative run's tokens are
checked equal to the plain run's. Reports tokens per verify step (vLLM's mean acceptance length)
and the decode speed-up, medians of `--rounds`. Thread CPU time, so a shared machine still gives
comparable figures. Usage:

    PYTHONPATH=runtime:operator:router:. .venv/bin/python bench/mtp.py [--quick] [--json PATH]
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from side_by_side import bench_args, report

from loom_runtime.engine.spec.speculator import MtpDrafter, MtpSpeculator, SequenceDrafter
from loom_runtime.models.sparse_mla.loader import load_sparse_mla
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.models.tiny_tokenizer import corpus_text


@dataclass(frozen=True)
class Row:
    drafter: str
    k: int
    tokens_per_step: float
    seconds: float
    speedup: float  # plain decode time / this run's decode time
    identical: bool


class ReplayDrafter:
    """Proposes the known greedy continuation; each draft is right with probability `alpha`
    (seeded), so acceptance lengths follow what a trained drafter of that accuracy gives."""

    def __init__(self, continuation: list[int], prompt_len: int, alpha: float, seed: int) -> None:
        self.continuation = continuation
        self.prompt_len = prompt_len
        self.alpha = alpha
        self.rng = random.Random(seed)
        self.first = 0  # index in `continuation` of the next draft's position

    def extend(self, normed: torch.Tensor, next_ids: list[int], start: int) -> None:
        self.first = start + len(next_ids) + 1 - self.prompt_len

    def propose(self, k: int) -> list[int]:
        out = []
        for j in range(k):
            true = self.continuation[min(self.first + j, len(self.continuation) - 1)]
            out.append(true if self.rng.random() < self.alpha else (true + 1) % 100)
        return out


def plain_decode(model: SparseMlaForCausalLM, prompt: list[int], n: int) -> tuple[list[int], float]:
    """Greedy tokens and the decode's thread CPU seconds (after the prompt's forward)."""
    cache = model.new_cache(len(prompt) + n + 8)
    logits = model.forward(torch.tensor(prompt), cache)
    out = [int(torch.argmax(logits[-1]))]
    start = time.thread_time()
    while len(out) < n:
        out.append(int(torch.argmax(model.forward(torch.tensor(out[-1:]), cache)[-1])))
    return out, time.thread_time() - start


def speculative_decode(
    model: SparseMlaForCausalLM, prompt: list[int], n: int, k: int, drafter: SequenceDrafter
) -> tuple[list[int], float, float]:
    """Tokens, tokens per verify step, and thread CPU seconds of the whole run less its
    prefill (measured as the plain prompt forward, which speculation runs identically plus
    one MTP forward over the prompt)."""
    spec = MtpSpeculator(model, k, len(prompt) + n + 8, drafter)
    start = time.thread_time()
    got = spec.generate(prompt, n)
    total = time.thread_time() - start
    prefill_start = time.thread_time()
    model.forward(torch.tensor(prompt), model.new_cache(len(prompt) + 1))
    prefill = time.thread_time() - prefill_start
    return list(got.token_ids), got.stats.mean_acceptance_length, max(total - prefill, 1e-9)


def run(prompt_tokens: int, new_tokens: int, ks: list[int], alphas: list[float], rounds: int,
        ) -> list[Row]:  # fmt: skip
    torch.set_num_threads(1)
    ckpt = init_tiny_sparse_mla(Path(tempfile.mkdtemp()) / "tiny")
    loaded = load_sparse_mla(ckpt, dtype=torch.float32)
    model = loaded.model
    prompt = loaded.tokenizer.encode(corpus_text())[:prompt_tokens]
    samples: dict[tuple[str, int], list[tuple[float, float, bool]]] = {}
    plain_times: list[float] = []
    for r in range(rounds):
        reference, plain_s = plain_decode(model, prompt, new_tokens)
        plain_times.append(plain_s)
        for k in ks:
            drafters: dict[str, SequenceDrafter] = {"mtp (random weights)": MtpDrafter(model, 4096)}
            for alpha in alphas:
                drafters[f"replay alpha={alpha:g}"] = ReplayDrafter(
                    reference, len(prompt), alpha, seed=r
                )
            for name, drafter in drafters.items():
                tokens, per_step, secs = speculative_decode(model, prompt, new_tokens, k, drafter)
                samples.setdefault((name, k), []).append((per_step, secs, tokens == reference))
                print(f"round {r + 1}/{rounds} k={k} {name}: {per_step:.2f} tok/step, "
                      f"{secs:.3f} s (plain {plain_s:.3f} s)", file=sys.stderr)  # fmt: skip
    plain = statistics.median(plain_times)
    rows = [Row("none (plain greedy)", 0, 1.0, plain, 1.0, True)]
    for (name, k), got in samples.items():
        secs = statistics.median(s for _, s, _ in got)
        per_step = statistics.median(p for p, _, _ in got)
        rows.append(Row(name, k, per_step, secs, plain / secs, all(i for _, _, i in got)))
    return rows


def main() -> int:
    args = bench_args(__doc__)
    if args.quick:
        rows = run(96, 12, [3], [0.8], 1)
    else:
        rows = run(512, 64, [1, 3], [0.5, 0.8, 1.0], args.rounds)
    columns = [("drafter", "---"), ("k", "---"), ("tokens per step", "---"), ("decode s", "---"),
               ("speed-up", "---"), ("identical", "---")]  # fmt: skip

    def cells(r: Row) -> list[str]:
        return [r.drafter, str(r.k), f"{r.tokens_per_step:.2f}", f"{r.seconds:.3f}",
                f"{r.speedup:.2f}×", str(r.identical)]  # fmt: skip

    return report(columns, rows, cells, args.json)


if __name__ == "__main__":
    sys.exit(main())
