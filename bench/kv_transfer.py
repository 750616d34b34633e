"""KV transfer: bytes/s of one KV pull with NIXL and with TCP, side by side with an in-process
memcpy of the same bytes (the upper bound), and TTFT of P/D vs aggregated for the same prompts.

Pulls: a prefill connector in a second process leases blocks of a pool shaped like the tiny model
(fp32) or Qwen2.5-0.5B (bf16, 24 layers, 2 KV heads, head dim 64), block size 16, block ids
scattered on both sides (a pool after churn: one descriptor per block) or contiguous (a fresh
pool); a decode connector in this process pulls 1k, 8k and 32k tokens and checks the bytes.
Each repeat times one memcpy, one NIXL pull and one TCP pull back to back, so all three see the
same machine load; median and best of the repeats are reported (on a busy shared machine the
best is the least disturbed). TTFT: streaming requests of fresh prompts (no prefix hits) to an
aggregated worker and, through the minimal P/D proxy, to a prefill + decode pair per connector,
interleaved; tiny model, fp32. Usage:

    .venv/bin/python bench/kv_transfer.py --out bench/results/kv_transfer.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"
BLOCK = 16
BYTE_PATTERN = 251  # pool byte i holds i % 251: any misplaced byte shows


@dataclass(frozen=True)
class KVShape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def pool(self, num_blocks: int, fill: bool) -> torch.Tensor:
        shape = (num_blocks, self.layers, 2, BLOCK, self.kv_heads, self.head_dim)
        kv = torch.zeros(shape, dtype=self.dtype)
        if fill:
            raw = kv.reshape(-1).view(torch.uint8)
            period = np.arange(BYTE_PATTERN, dtype=np.uint8)
            raw.copy_(torch.from_numpy(np.resize(period, raw.numel())))
        return kv

    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype.itemsize


SHAPES = {
    "tiny": KVShape("tiny", 6, 2, 64, torch.float32),
    "0.5b": KVShape("0.5b", 24, 2, 64, torch.bfloat16),
}


# ----------------------------------------------------------------------------- pulls


def prefill_helper(kind: str, shape: KVShape, num_blocks: int, conn: Connection) -> None:
    """The prefill side, in its own process: grants leases on request, frees what is released."""
    from loom_runtime.transfer.connector import ConnectorSettings, build_connector

    torch.set_num_threads(1)
    kv = shape.pool(num_blocks, fill=True)
    connector = build_connector(ConnectorSettings(kind, "prefill", side_port=0, lease_seconds=300))  # type: ignore[arg-type]
    connector.bind(kv, lambda: None)
    conn.send("ready")
    try:
        while True:
            connector.take_released()
            if not conn.poll(0.01):
                continue
            msg = conn.recv()
            if msg[0] == "stop":
                return
            _, rid, blocks, n = msg
            conn.send(connector.grant(rid, blocks, n, "v1").to_dict())
    finally:
        connector.close()


def check_pulled(kv: torch.Tensor, local: list[int], remote: list[int], block_bytes: int) -> None:
    """Every pulled block holds the prefill block's byte pattern."""
    raw = kv.reshape(-1).view(torch.uint8)
    for i in np.linspace(0, len(local) - 1, 8).astype(int).tolist():
        got = raw[local[i] * block_bytes : (local[i] + 1) * block_bytes]
        start = remote[i] * block_bytes
        want = (torch.arange(start, start + block_bytes) % BYTE_PATTERN).to(torch.uint8)
        if not torch.equal(got, want):
            raise AssertionError(f"pulled block {i} differs from the prefill's")


class PullSide:
    """A prefill helper process of one connector kind and this process's decode connector."""

    def __init__(self, kind: str, shape: KVShape, pool_blocks: int) -> None:
        from loom_runtime.transfer.connector import ConnectorSettings, build_connector

        self.kind = kind
        ctx = mp.get_context("spawn")
        self.pipe, theirs = ctx.Pipe()
        self.helper = ctx.Process(target=prefill_helper, args=(kind, shape, pool_blocks, theirs))
        self.helper.start()
        self.decode = build_connector(ConnectorSettings(kind, "decode"))  # type: ignore[arg-type]
        self.kv = shape.pool(pool_blocks, fill=False)
        self.woken = threading.Event()
        self.decode.bind(self.kv, self.woken.set)
        if not self.pipe.poll(120) or self.pipe.recv() != "ready":
            raise RuntimeError(f"{kind} prefill helper did not start")

    def pull(self, rid: str, remote: list[int], local: list[int], tokens: int) -> float:
        """Seconds from asking for the pull to seeing it done (pin, plan, read, notify)."""
        from loom_runtime.wire.kv_transfer import KVTransferParams

        self.pipe.send(("grant", rid, remote, tokens))
        params = KVTransferParams.parse(self.pipe.recv())
        self.woken.clear()
        t0 = time.perf_counter()
        self.decode.start_pull(rid, params, local, 0, tokens)
        while not (done := self.decode.take_pulled()):
            self.woken.wait(10)
            self.woken.clear()
        elapsed = time.perf_counter() - t0
        if done[0].error is not None:
            raise RuntimeError(done[0].error)
        check_pulled(self.kv, local, remote, self.kv[0].numel() * self.kv.element_size())
        return elapsed

    def close(self) -> None:
        self.pipe.send(("stop",))
        self.helper.join(timeout=60)
        self.decode.close()


def bench_point(shape: KVShape, tokens: int, repeats: int, placement: str) -> dict[str, Any]:
    """Interleaved repeats of: one memcpy of the bytes, one NIXL pull, one TCP pull (so all
    three see the same machine load); medians. `placement`: "scattered" block ids on both sides
    (a pool after churn: one descriptor per block) or "contiguous" (a fresh pool: runs merge)."""
    blocks, pool_blocks = tokens // BLOCK, tokens // BLOCK + 16
    nbytes = tokens * shape.bytes_per_token()
    src = np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8).copy()
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch
    sides = [PullSide(kind, shape, pool_blocks) for kind in ("nixl", "tcp")]
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {"memcpy": [], "nixl": [], "tcp": []}
    try:
        for r in range(repeats + 1):  # round 0 includes the handshakes: a warm-up
            t0 = time.perf_counter()
            np.copyto(dst, src)  # one thread, like one pull
            took = {"memcpy": time.perf_counter() - t0}
            for side in sides:
                if placement == "contiguous":
                    remote, local = list(range(blocks)), list(range(8, 8 + blocks))
                else:
                    remote = rng.permutation(pool_blocks)[:blocks].tolist()
                    local = rng.permutation(pool_blocks)[:blocks].tolist()
                took[side.kind] = side.pull(f"r{r}", remote, local, tokens)
            if r:
                for name, value in took.items():
                    times[name].append(value)
    finally:
        for side in sides:
            side.close()
    median = {name: nbytes / statistics.median(ts) / 1e9 for name, ts in times.items()}
    best = {name: nbytes / min(ts) / 1e9 for name, ts in times.items()}
    return {"nbytes": nbytes, "gbps": median, "best_gbps": best, "seconds": times}


def run_pulls(
    shapes: list[str], token_counts: list[int], repeats: int, placements: list[str]
) -> list[dict[str, Any]]:
    rows = []
    for placement in placements:
        for shape_name in shapes:
            shape = SHAPES[shape_name]
            for tokens in token_counts:
                got = bench_point(shape, tokens, repeats, placement)
                g, b = got["gbps"], got["best_gbps"]
                row: dict[str, Any] = {
                    "placement": placement,
                    "shape": shape_name,
                    "tokens": tokens,
                    "mib": got["nbytes"] / 2**20,
                    "seconds": got["seconds"],
                }
                for name in ("memcpy", "nixl", "tcp"):
                    row[f"{name}_gbps"], row[f"{name}_best_gbps"] = g[name], b[name]
                for kind in ("nixl", "tcp"):
                    row[f"{kind}_vs_memcpy"] = g[kind] / g["memcpy"]
                    row[f"{kind}_best_vs_memcpy_best"] = b[kind] / b["memcpy"]
                print(
                    f"pull {placement:10s} {shape_name:5s} {tokens:6d} tok {row['mib']:7.1f} MiB"
                    f" median/best GB/s: memcpy {g['memcpy']:.2f}/{b['memcpy']:.2f}"
                    f"  nixl {g['nixl']:.2f}/{b['nixl']:.2f}"
                    f" ({row['nixl_vs_memcpy']:.0%}/{row['nixl_best_vs_memcpy_best']:.0%})"
                    f"  tcp {g['tcp']:.2f}/{b['tcp']:.2f}"
                    f" ({row['tcp_vs_memcpy']:.0%}/{row['tcp_best_vs_memcpy_best']:.0%})",
                    flush=True,
                )
                rows.append(row)
    return rows


# ----------------------------------------------------------------------------- TTFT


async def ttft_of(url: str, prompt: list[int], model: str) -> float:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        t0 = time.perf_counter()
        async with session.post(url + "/v1/completions", json=body) as resp:
            resp.raise_for_status()
            async for raw in resp.content:
                line = raw.decode().strip()
                if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                    return time.perf_counter() - t0
    raise RuntimeError("no token streamed")


def run_ttft(lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    from contextlib import ExitStack

    from loom_runtime.models.tiny import init_tiny
    from loom_runtime.testing.processes import Launcher

    ckpt = CACHE / "tiny"
    if not (ckpt / "config.json").exists():
        init_tiny(ckpt, seed=0)
    launcher = Launcher(Path(tempfile.mkdtemp()), ckpt, model="bench", dtype="float32")
    flags = ["--max-model-len", "8192", "--num-blocks", "1200", "--max-num-seqs", "4"]
    rng = torch.Generator().manual_seed(0)
    with ExitStack() as stack:
        urls = {"aggregated": stack.enter_context(launcher.worker("aggregated", *flags)).base_url}
        for kind in ("nixl", "tcp"):
            prefill = stack.enter_context(
                launcher.worker("prefill", "--kv-connector", kind, *flags, name=f"p-{kind}")
            )
            decode = stack.enter_context(
                launcher.worker("decode", "--kv-connector", kind, *flags, name=f"d-{kind}")
            )
            urls[kind] = stack.enter_context(launcher.proxy(prefill, decode, f"x-{kind}")).base_url
        # One warm-up each (handshakes, first allocations), then interleaved repeats.
        for url in urls.values():
            asyncio.run(
                ttft_of(url, torch.randint(10, 4000, (64,), generator=rng).tolist(), "bench")
            )
        times: dict[tuple[int, str], list[float]] = {}
        for _ in range(repeats):
            for n in lengths:
                for mode, url in urls.items():
                    prompt = torch.randint(10, 4000, (n,), generator=rng).tolist()  # fresh: no hits
                    times.setdefault((n, mode), []).append(
                        asyncio.run(ttft_of(url, prompt, "bench"))
                    )
    rows = []
    for n in lengths:
        row: dict[str, Any] = {"tokens": n, "samples": {m: times[(n, m)] for m in urls}}
        for mode in urls:
            row[f"{mode}_s"] = statistics.median(times[(n, mode)])
            row[f"{mode}_best_s"] = min(times[(n, mode)])
        for kind in ("nixl", "tcp"):
            row[f"{kind}_vs_aggregated"] = row[f"{kind}_s"] / row["aggregated_s"]
            row[f"{kind}_best_vs_aggregated_best"] = (
                row[f"{kind}_best_s"] / row["aggregated_best_s"]
            )
        print(
            f"ttft {n:5d} tok median (best): aggregated {row['aggregated_s']:.3f}s"
            f" ({row['aggregated_best_s']:.3f})"
            f"  P/D nixl {row['nixl_s']:.3f}s {row['nixl_vs_aggregated']:.2f}x"
            f" ({row['nixl_best_vs_aggregated_best']:.2f}x)"
            f"  P/D tcp {row['tcp_s']:.3f}s {row['tcp_vs_aggregated']:.2f}x"
            f" ({row['tcp_best_vs_aggregated_best']:.2f}x)",
            flush=True,
        )
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="tiny,0.5b")
    parser.add_argument("--tokens", default="1024,8192,32768")
    parser.add_argument("--placements", default="scattered,contiguous")
    parser.add_argument("--ttft-tokens", default="1000,8000")
    parser.add_argument("--repeats", type=int, default=15, help="pulls per point")
    parser.add_argument("--ttft-repeats", type=int, default=5)
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument("--skip-pulls", action="store_true")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "block_size": BLOCK,
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    if not args.skip_pulls:
        results["pulls"] = run_pulls(
            args.shapes.split(","),
            [int(t) for t in args.tokens.split(",")],
            args.repeats,
            args.placements.split(","),
        )
    if not args.skip_ttft:
        lengths = [int(t) for t in args.ttft_tokens.split(",")]
        results["ttft"] = run_ttft(lengths, args.ttft_repeats)
    results["loadavg_end"] = os.getloadavg()  # other work on a shared machine skews the numbers
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
