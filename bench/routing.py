"""Routing policies compared on a multi-turn agentic workload against local tiny-model workers.

The workload (the llm-d benchmark's shape, scaled to a CPU; built by `bench/agentic_trace.py`):
groups of users share a long system prompt; each user runs a session whose context grows every
turn (system prompt + every earlier user message and answer + the new message); sessions start
as a Poisson process and think between turns. The same seeded workload is replayed, one fresh
set of workers per policy (empty caches), through the real router under: random, round-robin,
load-only (prefix weight 0, no session affinity), approximate-prefix, precise-prefix (the card's
defaults for one router replica: KV events, plus prompts just routed counted as cached for 10 s,
inFlightPrefixSeconds) and precise-events-only (inFlightPrefixSeconds 0: what replicas > 1 run
by default, deciding from KV events alone). Reported per policy: output tok/s, client TTFT
p50/p90, prefix-cache hit rate (cached prompt tokens the workers reported / prompt tokens) and
the hit rate of an oracle that knows every cache (at each request, the longest prefix any worker
held at its arrival, read from all workers' KV events; a policy that follows a prompt to where
it is still being prefilled can beat it). Each policy runs `--rounds` times, the order rotated
every round, and the median of each number is reported (a shared machine has slow spells;
rotation spreads them over the policies). Targets: precise ≥ 90 % of its oracle, and precise
TTFT p90 ≤ 0.5 × round-robin's. Usage:

    OMP_NUM_THREADS=1 .venv/bin/python bench/routing.py --out bench/results/routing.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
from agentic_trace import Session, TraceShape, workload

from loom_operator.testing.router import router_command
from loom_router.core.endpoints import Endpoint, EndpointSnapshot
from loom_router.core.kv_events import index_key
from loom_router.core.prefix_index import PrefixIndex
from loom_router.shell.kv_subscriber import KVSubscriber
from loom_router.shell.metrics import RouterMetrics
from loom_runtime.models.tiny import init_tiny
from loom_runtime.testing.processes import Launcher, Proc, free_ports, poll, post, spawn
from loom_runtime.wire.prefix_hash import PrefixHasher

ROOT = Path(__file__).resolve().parent.parent
MODEL = "tiny-routing"
BLOCK = 16
TOKEN = "bench-admin"
POLICIES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "random": ({}, ("--policy", "random")),
    "round-robin": ({}, ("--policy", "round-robin")),
    "load-only": ({"scorers": {"prefixCache": 0.0}, "sessionAffinity": {"enabled": False}}, ()),
    "approximate-prefix": ({"prefixScorer": "approximate"}, ()),
    "precise-prefix": ({}, ()),
    "precise-events-only": ({"inFlightPrefixSeconds": 0.0}, ()),
}


@dataclass(frozen=True)
class Sample:
    policy: str
    session: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    oracle_tokens: int
    completion_tokens: int
    ttft_s: float
    start_s: float
    end_s: float
    endpoint: str


class Oracle:
    """Knows every worker's cache (from their KV events): the best hit any worker offers."""

    def __init__(self, workers: dict[str, dict[str, Any]]) -> None:
        self.hasher = PrefixHasher(BLOCK, "0", "sha256_cbor")
        self.index = PrefixIndex(2_000_000, self.hasher)
        self.sub = KVSubscriber(self.index, RouterMetrics(), poll_ms=5)
        self.ids = list(workers)
        endpoints = tuple(
            Endpoint(
                w,
                spec["url"],
                "aggregated",
                "v1",
                kv_events=spec["kv_events"],
                kv_replay=spec["kv_replay"],
            )
            for w, spec in workers.items()
        )
        self.sub.start()
        self.sub.sync(EndpointSnapshot(endpoints))

    def cached(self, prompt: list[int]) -> int:
        keys = [index_key(h) for h in self.hasher.hash_blocks(prompt)]
        best = max(self.index.match(self.ids, keys).values(), default=0)
        return min(best, (len(prompt) - 1) // BLOCK) * BLOCK

    def close(self) -> None:
        self.sub.close()


@contextmanager
def fleet(
    args: argparse.Namespace, tmp: Path, checkpoint: Path, tag: str
) -> Iterator[dict[str, tuple[Proc, dict[str, Any]]]]:
    """`args.workers` fresh workers (empty caches), started in parallel, warmed up."""
    launcher = Launcher(tmp, checkpoint, model=MODEL, dtype="float32")
    ports = [free_ports(2) for _ in range(args.workers)]
    flags = [
        "--num-blocks",
        str(args.num_blocks),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-model-len",
        "4096",
    ]
    managers = [
        launcher.worker(
            "aggregated",
            "--kv-events-port",
            str(kv),
            "--kv-events-replay-port",
            str(replay),
            *flags,
            name=f"{tag}-w{i}",
        )
        for i, (kv, replay) in enumerate(ports)
    ]
    with ExitStack() as stack, ThreadPoolExecutor(len(managers)) as pool:
        started = [pool.submit(m.__enter__) for m in managers]
        procs: list[Proc] = []
        for manager, future in zip(managers, started, strict=True):
            try:
                procs.append(future.result())
            except Exception:
                continue  # it cleaned up after itself; the others are stopped below
            stack.push(manager)
        if len(procs) != len(managers):
            raise RuntimeError("a worker did not start; see the logs under " + str(tmp))
        out = {}
        for i, (proc, (kv, replay)) in enumerate(zip(procs, ports, strict=True)):
            post(
                proc.base_url + "/v1/completions",
                {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2},
            )  # warm up
            out[f"w{i}"] = (
                proc,
                {
                    "id": f"w{i}",
                    "url": proc.base_url,
                    "role": "aggregated",
                    "weights_version": "v1",
                    "kv_events": f"tcp://127.0.0.1:{kv}",
                    "kv_replay": f"tcp://127.0.0.1:{replay}",
                },
            )
        yield out


@contextmanager
def router(tmp: Path, checkpoint: Path, policy: str, specs: list[dict[str, Any]]) -> Iterator[str]:
    spec, flags = POLICIES[policy]
    config = {
        "model_name": MODEL,
        "tokenizer_path": str(checkpoint),
        "block_size": BLOCK,
        "router": spec,
        "failover": {},
        "endpoints": specs,
    }
    path = tmp / f"router-{policy}.json"
    path.write_text(json.dumps(config))
    port, admin = free_ports(2)
    cmd = router_command(path, port, admin, TOKEN, *flags)
    url = f"http://127.0.0.1:{port}"
    with spawn(f"router-{policy}", cmd, tmp / f"router-{policy}.log", url, "/ready"):
        yield url


async def one_turn(
    http: aiohttp.ClientSession, url: str, prompt: list[int], session_token: str, max_tokens: int
) -> tuple[float, list[int], dict[str, Any], str]:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    start = time.perf_counter()
    ttft = -1.0
    tokens: list[int] = []
    usage: dict[str, Any] = {}
    headers = {"x-session-token": session_token}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"router answered {resp.status}: {await resp.text()}")
        endpoint = resp.headers.get("x-loom-endpoint", "")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if event.get("choices"):
                ids = event["choices"][0].get("token_ids") or []
                if ids and ttft < 0:
                    ttft = time.perf_counter() - start
                tokens += ids
            elif event.get("usage"):
                usage = event["usage"]
    return ttft, tokens, usage, endpoint


async def run_policy(
    policy: str,
    url: str,
    systems: list[tuple[int, ...]],
    sessions: list[Session],
    oracle: Oracle,
    max_tokens: int,
) -> list[Sample]:
    samples: list[Sample] = []
    t0 = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def run(index: int, s: Session) -> None:
            await asyncio.sleep(max(0.0, s.start_s - (time.perf_counter() - t0)))
            context = list(systems[s.group])
            for turn, message in enumerate(s.messages):
                prompt = context + list(message)
                oracle_tokens = await asyncio.to_thread(oracle.cached, prompt)
                start = time.perf_counter() - t0
                ttft, out, usage, endpoint = await one_turn(
                    http, url, prompt, f"s{index}", max_tokens
                )
                samples.append(
                    Sample(
                        policy,
                        index,
                        turn,
                        usage["prompt_tokens"],
                        usage["prompt_tokens_details"]["cached_tokens"],
                        oracle_tokens,
                        usage["completion_tokens"],
                        ttft,
                        start,
                        time.perf_counter() - t0,
                        endpoint,
                    )
                )
                context = prompt + out
                await asyncio.sleep(s.thinks[turn])

        await asyncio.gather(*(run(i, s) for i, s in enumerate(sessions)))
    return samples


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(policy: str, samples: list[Sample]) -> dict[str, Any]:
    prompt = sum(s.prompt_tokens for s in samples)
    span = max(s.end_s for s in samples) - min(s.start_s for s in samples)
    ttfts = [s.ttft_s for s in samples]
    per_endpoint: dict[str, int] = {}
    for s in samples:
        per_endpoint[s.endpoint] = per_endpoint.get(s.endpoint, 0) + 1
    hit = sum(s.cached_tokens for s in samples) / prompt
    oracle = sum(s.oracle_tokens for s in samples) / prompt
    return {
        "policy": policy,
        "requests": len(samples),
        "output_tok_s": sum(s.completion_tokens for s in samples) / span,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p90_s": _pct(ttfts, 0.9),
        "ttft_max_s": max(ttfts),
        "hit_rate": hit,
        "oracle_hit_rate": oracle,
        "hit_vs_oracle": hit / oracle if oracle else 0.0,
        "makespan_s": span,
        "requests_per_endpoint": dict(sorted(per_endpoint.items())),
    }


def run_one(
    args: argparse.Namespace,
    checkpoint: Path,
    policy: str,
    systems: list[tuple[int, ...]],
    sessions: list[Session],
) -> dict[str, Any]:
    """One policy on fresh workers: the workload replayed, summarized."""
    with fleet(args, args.tmp, checkpoint, policy) as workers:
        specs = {w: spec for w, (_, spec) in workers.items()}
        oracle = Oracle(specs)
        try:
            with router(args.tmp, checkpoint, policy, list(specs.values())) as url:
                poll(partial(_fresh, url, list(specs)), 30, "fresh scrapes")
                samples = asyncio.run(
                    run_policy(policy, url, systems, sessions, oracle, args.output_tokens)
                )
        finally:
            oracle.close()
    row = summarize(policy, samples)
    if args.samples:
        row["samples"] = [asdict(s) for s in sorted(samples, key=lambda s: s.start_s)]
    return row


def combine(policy: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every number over the rounds (the rounds themselves kept too)."""
    out: dict[str, Any] = {"policy": policy, "rounds": len(runs)}
    for key, value in runs[0].items():
        if isinstance(value, int | float) and key != "round":
            out[key] = statistics.median(r[key] for r in runs)
    out["runs"] = runs
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--users", type=int, default=4, help="users per group")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--system-tokens", type=int, default=1024)
    parser.add_argument("--user-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=12)
    parser.add_argument("--rate", type=float, default=0.5, help="new sessions per second")
    parser.add_argument("--think-s", type=float, default=1.0, help="mean think time")
    parser.add_argument("--num-blocks", type=int, default=256, help="KV blocks per worker")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2, help="each policy this many times")
    parser.add_argument("--samples", action="store_true", help="every request in the JSON too")
    parser.add_argument("--tmp", type=Path, default=ROOT / ".cache/bench-routing")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/routing.json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the workers on the way out
    args.tmp.mkdir(parents=True, exist_ok=True)
    checkpoint = args.tmp / "tiny"
    if not (checkpoint / "config.json").is_file():
        init_tiny(checkpoint, seed=0)
    systems, sessions = workload(TraceShape.from_args(args))
    policies = args.policies.split(",")
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    for round_ in range(args.rounds):
        # Rotate the order each round, so slow spells of a shared machine hit every policy.
        for policy in policies[round_ % len(policies) :] + policies[: round_ % len(policies)]:
            row = run_one(args, checkpoint, policy, systems, sessions)
            row["round"] = round_
            runs[policy].append(row)
            brief = {k: v for k, v in row.items() if k != "samples"}
            print(f"  {policy}: {json.dumps(brief)}", file=sys.stderr)
    rows = [combine(policy, runs[policy]) for policy in policies]
    report(rows, args)
    return 0


def _fresh(url: str, ids: list[str]) -> bool:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return all(f'loom_router:scrape_stale{{endpoint="{i}"}} 0.0' in text for i in ids)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"{'policy':<19} {'out tok/s':>9} {'TTFT p50':>9} {'TTFT p90':>9} {'hit':>6} "
        f"{'oracle':>6} {'hit/orc':>7}"
    )
    for r in rows:
        print(
            f"{r['policy']:<19} {r['output_tok_s']:>9.1f} {r['ttft_p50_s']:>8.2f}s "
            f"{r['ttft_p90_s']:>8.2f}s {r['hit_rate']:>6.1%} {r['oracle_hit_rate']:>6.1%} "
            f"{r['hit_vs_oracle']:>7.1%}"
        )
    by = {r["policy"]: r for r in rows}
    verdicts = {}
    if "precise-prefix" in by:
        p = by["precise-prefix"]
        verdicts["precise_hit_vs_oracle_ge_90pct"] = p["hit_vs_oracle"] >= 0.9
        if "round-robin" in by:
            ratio = p["ttft_p90_s"] / by["round-robin"]["ttft_p90_s"]
            verdicts["precise_ttft_p90_vs_round_robin"] = ratio
            verdicts["precise_ttft_p90_le_half_round_robin"] = ratio <= 0.5
    for name, value in verdicts.items():
        print(f"{name}: {value}")
    config = {k: v for k, v in vars(args).items() if k not in ("tmp", "out")}
    result = {
        "bench": "routing",
        "command": " ".join(["bench/routing.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "config": config,
        "policies": rows,
        "verdicts": verdicts,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
