"""Hybrid HiSparse decode against the all-on-device latent cache, side by side in one run.

For each prompt length, one greedy request (the tiny sparse-mla checkpoint, index top-k 64,
float64) runs through the engine all on the device, then with HiSparse at several hot-buffer
sizes. It reports whether the tokens are equal, the hot buffer's hit rate, rows and bytes
copied host -> device per decode step against the bytes of the whole context's rows (what a
decode that read every row from the host would move), the device bytes per cached token, and
the decode step time (prefill excluded) relative to all-on-device (on this CPU both tiers are
host memory, so the time says what the bookkeeping costs, not what PCIe would).

Usage:

    .venv/bin/python bench/hisparse.py --lengths 2048,8000 --hot 65,129,257 --decode-steps 64
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.models.tiny_tokenizer import corpus_text

BLOCK = 16


@dataclass(frozen=True)
class Run:
    length: int
    hot_slots: int  # 0: all on the device
    tokens_equal_device: bool
    hit_rate: float
    misses_per_step: float  # rows, all layers
    h2d_bytes_per_step: float
    context_bytes: int  # every latent row of the context, all layers
    device_bytes_per_token: float  # device KV bytes per cached token (hot buffers shared out)
    decode_step_s: float


def prompt_of(loaded: LoadedModel, length: int) -> list[int]:
    ids = loaded.tokenizer.encode(corpus_text())
    return (ids * (length // len(ids) + 1))[:length]


def one(loaded: LoadedModel, length: int, hot: int, steps: int) -> tuple[tuple[int, ...], Run]:
    blocks = -(-(length + steps) // BLOCK) + 1
    spec = loaded.config.kv_spec(BLOCK, 1, torch.float64)
    host_block = spec.bytes_per_block  # the host tier holds whole latent blocks
    config = EngineConfig(
        dtype=torch.float64,
        max_model_len=length + steps + BLOCK,
        max_num_seqs=1,
        max_num_batched_tokens=2048,
        prefix_caching=False,
        num_blocks=blocks,
        hisparse_host_pool_gib=blocks * host_block / (1 << 30) if hot else 0.0,
        hisparse_hot_slots=hot or None,
    )
    engine = Engine(loaded, config)
    sampling = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    req = EngineRequest("bench", tuple(prompt_of(loaded, length)), sampling)
    collector = OutputCollector(req)
    engine.add_request(req, collector)
    while engine.stats().num_generation_tokens < 1:  # the prefill steps
        engine.step()
    before = engine.stats()
    start = time.perf_counter()
    while not collector.done.is_set():
        engine.step()
    decode_s = (time.perf_counter() - start) / steps
    out = collector.result()
    s = engine.stats()
    hits = s.hisparse_hot_hits - before.hisparse_hot_hits
    misses = s.hisparse_hot_misses - before.hisparse_hot_misses
    row = spec.row_width * 8  # type: ignore[attr-defined]
    return out.output_token_ids, Run(
        length=length,
        hot_slots=hot,
        tokens_equal_device=True,
        hit_rate=hits / (hits + misses) if hits + misses else 0.0,
        misses_per_step=misses / steps,
        h2d_bytes_per_step=(s.hisparse_h2d_bytes - before.hisparse_h2d_bytes) / steps,
        context_bytes=length * spec.num_layers * row,  # type: ignore[attr-defined]
        device_bytes_per_token=s.kv_cache_bytes / (blocks * BLOCK),
        decode_step_s=decode_s,
    )


def report(runs: list[Run]) -> str:
    lines = [
        "| context | hot slots | tokens equal | hit rate | misses/step | H2D KiB/step | "
        "of context rows | device B/token | decode step vs device |",
        "|---:|---:|:---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {r.length: r.decode_step_s for r in runs if r.hot_slots == 0}
    for r in runs:
        lines.append(
            f"| {r.length} | {r.hot_slots or 'all on device'} | {r.tokens_equal_device} | "
            f"{r.hit_rate:.1%} | {r.misses_per_step:.0f} | {r.h2d_bytes_per_step / 1024:.1f} | "
            f"{r.h2d_bytes_per_step / r.context_bytes:.1%} | {r.device_bytes_per_token:.0f} | "
            f"{r.decode_step_s / base[r.length]:.2f}x |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="2048,8000")  # + steps within the 8192 positions
    p.add_argument("--hot", default="65,129,257", help="hot-buffer slots per layer to try")
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_model(init_tiny_sparse_mla(Path(tmp) / "tiny"), dtype=torch.float64)
    runs: list[Run] = []
    for length in (int(x) for x in args.lengths.split(",")):
        want, base = one(loaded, length, 0, args.decode_steps)
        runs.append(base)
        for hot in (int(x) for x in args.hot.split(",")):
            got, run = one(loaded, length, hot, args.decode_steps)
            runs.append(run.__class__(**{**asdict(run), "tokens_equal_device": got == want}))
    print(report(runs))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 0 if all(r.tokens_equal_device for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
