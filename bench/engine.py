"""Loom's engine (via its OpenAI server) vs `transformers` `generate`, side by side.

For each model config it runs, on the same prompt token ids and greedy decoding:
  - single stream: prompts one after another (Loom: one streaming request at a time;
    transformers: one `generate` per prompt), and
  - concurrent: N requests at once, all with the same output length (Loom: N concurrent
    streaming requests to the server; transformers: one left-padded batched `generate`, the
    best a static batcher can do), and
  - mixed: N requests at once whose output lengths differ (max_tokens/4 .. 2*max_tokens), as
    real traffic does (transformers' batch runs until its longest request is done; only each
    request's own tokens count),
and reports output tok/s, TTFT p50/p90 and Loom/transformers ratios, and output tokens per
CPU-second (Loom: its server process; transformers: the bench process), which a machine
shared with other work distorts far less than wall time. Each repeat uses fresh
prompts (so Loom's prefix cache gives it nothing a baseline could not have); the summary is the
median over repeats. Usage:

    .venv/bin/python bench/engine.py --configs tiny,0.5b --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import torch

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"


@dataclass(frozen=True)
class BenchConfig:
    name: str
    prompt_lens: tuple[int, int]  # min, max prompt tokens
    max_tokens: int


CONFIGS = {
    "tiny": BenchConfig("tiny", (64, 512), 64),
    "0.5b": BenchConfig("0.5b", (32, 160), 32),
}


@dataclass(frozen=True)
class PhaseResult:
    engine: str
    phase: str  # single | concurrent
    output_tokens: int
    wall_s: float
    ttft_s: list[float]
    cpu_s: float  # CPU time the engine's process spent on the phase (all its threads)

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def tok_per_cpu_s(self) -> float:
        return self.output_tokens / self.cpu_s

    def ttft(self, q: float) -> float:
        xs = sorted(self.ttft_s)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


# ----------------------------------------------------------------------------- checkpoints


def tiny_checkpoint() -> Path:
    from loom_runtime.models.tiny import init_tiny

    path = CACHE / "tiny"
    if not (path / "config.json").exists():
        init_tiny(path, seed=0)
    return path


def half_b_checkpoint() -> Path:
    """A Qwen2.5-0.5B-shaped checkpoint with random weights and the tiny tokenizer."""
    path = CACHE / "qwen2-0.5b-shape"
    if (path / "config.json").exists():
        return path
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    tmp = Path(tempfile.mkdtemp(dir=CACHE))
    model.save_pretrained(tmp, safe_serialization=True)
    tiny = tiny_checkpoint()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp / name).write_bytes((tiny / name).read_bytes())
    tmp.rename(path)
    return path


def checkpoint(name: str) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    return tiny_checkpoint() if name == "tiny" else half_b_checkpoint()


# ----------------------------------------------------------------------------- prompts


def make_prompts(ckpt: Path, cfg: BenchConfig, n: int, round_: int) -> list[list[int]]:
    """n prompts of mixed lengths cut from the shipped corpus; each round starts elsewhere."""
    from tokenizers import Tokenizer

    corpus = (ROOT / "runtime/loom_runtime/models/data/tiny_corpus.txt").read_text()
    ids = Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode(corpus).ids
    lo, hi = cfg.prompt_lens
    prompts = []
    for i in range(n):
        length = lo + (i * 7919) % (hi - lo + 1)
        start = ((round_ * n + i) * 104729) % max(1, len(ids) - hi)
        prompts.append(ids[start : start + length])
    return prompts


# ----------------------------------------------------------------------------- Loom


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoomServer:
    def __init__(self, ckpt: Path, max_num_seqs: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp())
        card = self.dir / "card.yaml"
        card.write_text(
            "apiVersion: loom.dev/v1alpha1\nkind: ModelCard\nmetadata: {name: bench}\n"
            "spec:\n  family: llama\n  components:\n  - name: decoder\n    kind: transformer\n"
            f"    source: {{uri: 'file://{ckpt}'}}\n    precision: {{weights: fp32, kv: fp32}}\n"
            "  loops: [{name: generate, kind: ar_decode, components: [decoder]}]\n"
            "  recipe: {method: base, assumesLoop: generate, assumesPrecision: fp32}\n"
        )
        cmd = [
            sys.executable,
            "-m",
            "loom_runtime",
            "runtime",
            "--card",
            str(card),
            "--port",
            str(self.port),
            "--max-num-seqs",
            str(max_num_seqs),
        ]
        self.log = open(self.dir / "server.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(self.dir / 'server.log').read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("server not ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def stream_one(
    session: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int
) -> tuple[float, int]:
    """(ttft seconds, output tokens) of one streaming completion."""
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices"):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    assert ttft is not None
    return ttft, tokens


@dataclass(frozen=True)
class Phase:
    """One measured workload: prompts, each request's output length, and whether concurrent."""

    name: str  # single | concurrent | mixed
    prompts: list[list[int]]
    lengths: list[int]  # max_tokens of each request (ignore_eos, so exactly this many)
    concurrent: bool


async def loom_phase(server: LoomServer, phase: Phase) -> PhaseResult:
    timeout = aiohttp.ClientTimeout(total=3600)
    work = list(zip(phase.prompts, phase.lengths, strict=True))
    url = server.url
    async with aiohttp.ClientSession(timeout=timeout) as session:
        cpu0 = process_cpu_s(server.proc.pid)
        t0 = time.perf_counter()
        if phase.concurrent:
            results = await asyncio.gather(*(stream_one(session, url, p, n) for p, n in work))
        else:
            results = [await stream_one(session, url, p, n) for p, n in work]
        wall = time.perf_counter() - t0
        cpu = process_cpu_s(server.proc.pid) - cpu0
    tokens = sum(t for _, t in results)
    return PhaseResult("loom", phase.name, tokens, wall, [f for f, _ in results], cpu)


# ----------------------------------------------------------------------------- transformers


class FirstTokenTimer:
    """A transformers streamer that records when the first generated token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 is the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_generate(model: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    """One batched greedy generate (left padding); returns (ttft, output tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    timer = FirstTokenTimer()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
            streamer=timer,
        )
    assert timer.first is not None
    return timer.first - t0, int(out.shape[1] - width) * len(prompts)


def hf_phase(model: Any, phase: Phase) -> PhaseResult:
    """Static batching: one padded `generate` runs until the longest request is done.

    Only each request's own tokens count as output (a server would cut the rest off).
    """
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    if phase.concurrent:
        ttft, _ = hf_generate(model, phase.prompts, max(phase.lengths))
        ttfts, tokens = [ttft] * len(phase.prompts), sum(phase.lengths)
    else:
        pairs = [
            hf_generate(model, [p], n) for p, n in zip(phase.prompts, phase.lengths, strict=True)
        ]
        ttfts, tokens = [f for f, _ in pairs], sum(t for _, t in pairs)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return PhaseResult("transformers", phase.name, tokens, wall, ttfts, cpu)


# ----------------------------------------------------------------------------- driver


def phases(ckpt: Path, cfg: BenchConfig, round_: int, singles: int, n: int) -> list[Phase]:
    """single: one at a time; concurrent: n at once, equal lengths; mixed: n at once, lengths
    from max_tokens/4 to 2*max_tokens (what real traffic looks like)."""
    m = cfg.max_tokens
    mixed = [m // 4 + (i * 37) % (2 * m - m // 4 + 1) for i in range(n)]
    return [
        Phase("single", make_prompts(ckpt, cfg, singles, 3 * round_), [m] * singles, False),
        Phase("concurrent", make_prompts(ckpt, cfg, n, 3 * round_ + 1), [m] * n, True),
        Phase("mixed", make_prompts(ckpt, cfg, n, 3 * round_ + 2), mixed, True),
    ]


def run_config(cfg: BenchConfig, repeats: int, concurrency: int, singles: int) -> dict[str, Any]:
    """Each round runs Loom's phases, then transformers' on the same prompts, so both see the
    same machine load; round 0 is a warm-up and is not counted."""
    from transformers import AutoModelForCausalLM

    ckpt = checkpoint(cfg.name)
    results: list[PhaseResult] = []
    server = LoomServer(ckpt, max_num_seqs=max(concurrency, 16))
    try:
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        server.wait_ready()
        for r in range(repeats + 1):
            for ph in phases(ckpt, cfg, r, singles, concurrency):
                got = [asyncio.run(loom_phase(server, ph)), hf_phase(model, ph)]
                results += got if r else []
    finally:
        server.stop()
    return summarize(cfg, results)


def summarize(cfg: BenchConfig, results: list[PhaseResult]) -> dict[str, Any]:
    summary: dict[str, Any] = {"config": asdict(cfg), "runs": [], "median": {}}
    for res in results:
        summary["runs"].append(
            {
                "engine": res.engine,
                "phase": res.phase,
                "tok_per_s": res.tok_per_s,
                "tok_per_cpu_s": res.tok_per_cpu_s,
                "output_tokens": res.output_tokens,
                "wall_s": res.wall_s,
                "ttft_p50": res.ttft(0.5),
                "ttft_p90": res.ttft(0.9),
            }
        )
    for phase in ("single", "concurrent", "mixed"):
        med: dict[str, float] = {}
        for engine in ("loom", "transformers"):
            runs = [r for r in summary["runs"] if r["engine"] == engine and r["phase"] == phase]
            for key in ("tok_per_s", "tok_per_cpu_s", "ttft_p50", "ttft_p90"):
                med[f"{engine}_{key}"] = statistics.median(r[key] for r in runs)
        med["throughput_ratio"] = med["loom_tok_per_s"] / med["transformers_tok_per_s"]
        med["cpu_ratio"] = med["loom_tok_per_cpu_s"] / med["transformers_tok_per_cpu_s"]
        summary["median"][phase] = med
    return summary


def print_table(name: str, summary: dict[str, Any]) -> None:
    print(f"\n== {name}  (medians; ratio = Loom / transformers)")
    print(f"{'phase':<11}{'engine':<14}{'tok/s':>9}{'tok/CPU-s':>11}", end="")
    print(f"{'TTFT p50':>10}{'TTFT p90':>10}")
    for phase, med in summary["median"].items():
        for engine in ("loom", "transformers"):
            print(
                f"{phase:<11}{engine:<14}{med[f'{engine}_tok_per_s']:>9.1f}"
                f"{med[f'{engine}_tok_per_cpu_s']:>11.1f}"
                f"{med[f'{engine}_ttft_p50']:>10.3f}{med[f'{engine}_ttft_p90']:>10.3f}"
            )
        print(f"{'':<11}{'ratio':<14}{med['throughput_ratio']:>9.2f}x{med['cpu_ratio']:>10.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="tiny,0.5b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--singles", type=int, default=4, help="prompts in the single-stream phase")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/engine.json")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "command": " ".join(sys.argv),
        "results": {},
    }
    for name in args.configs.split(","):
        summary = run_config(CONFIGS[name], args.repeats, args.concurrency, args.singles)
        report["results"][name] = summary
        print_table(name, summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
