"""How long the router's pure core takes to pick an endpoint, at 10, 100 and 1,000 endpoints.

Each fleet is 3/4 decode and 1/4 prefill endpoints with realistic state: a precise prefix index
holding, per endpoint, the KV chains of a few of 150 shared 6k-token system prompts plus user
turns (the llm-d benchmark's shape: 150 groups sharing 6k-token prompts), fresh metrics and
in-flight counts for every endpoint. Requests are a group's system prompt plus a 512-token user
turn. Reported per fleet size: the pick itself (filters → scorers → hot-spot rule → picker →
P/D decider) p50/p99/max, building the load view for a pick, and, once, hashing a 6.5k-token
prompt the way the engine does (per request, independent of fleet size; the proxy shell runs it
off the event loop). Target: pick p99 < 1 ms at 100 endpoints. Usage:

    .venv/bin/python bench/router_overhead.py --out bench/results/router_overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loom_operator.router.endpoints import Endpoint, EndpointSnapshot
from loom_operator.router.kv_events import DecodedBatch
from loom_operator.router.load import EngineMetrics, LoadTracker
from loom_operator.router.pipeline import RoutingInputs, Scheduler
from loom_operator.router.prefix_index import PrefixIndex
from loom_operator.router.request import RequestFeatures, features_from_tokens
from loom_operator.router.settings import RouterSettings
from loom_runtime.wire.kv_events import BlockStored
from loom_runtime.wire.prefix_hash import PrefixHasher

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 16
GROUPS = 150
SYSTEM_BLOCKS = 6144 // BLOCK  # 384 blocks of shared system prompt
USER_BLOCKS = 512 // BLOCK
GROUPS_PER_ENDPOINT = 6
USERS_PER_ENDPOINT = 20


@dataclass(frozen=True)
class Fleet:
    snapshot: EndpointSnapshot
    index: PrefixIndex
    tracker: LoadTracker
    groups: list[list[int]]


def _keys(rng: random.Random, n: int) -> list[int]:
    return [rng.getrandbits(64) for _ in range(n)]


def _store(index: PrefixIndex, endpoint_id: str, keys: list[int]) -> None:
    event = BlockStored(
        block_hashes=tuple(k.to_bytes(8, "big") for k in keys),
        parent_block_hash=None,
        token_ids=(0,) * (len(keys) * BLOCK),
        block_size=BLOCK,
    )
    index.apply_batch(endpoint_id, DecodedBatch(0.0, (event,), 0))


def build_fleet(n: int, rng: random.Random, max_entries: int) -> Fleet:
    n_prefill = max(1, n // 4)
    endpoints = [
        Endpoint(
            id=f"{'prefill' if i < n_prefill else 'decode'}-{i:04d}",
            url=f"http://10.0.{i // 250}.{i % 250}:8000",
            role="prefill" if i < n_prefill else "decode",
            weights_version="v1",
        )
        for i in range(n)
    ]
    groups = [_keys(rng, SYSTEM_BLOCKS) for _ in range(GROUPS)]
    index = PrefixIndex(max_entries=max_entries)
    tracker = LoadTracker()
    for e in endpoints:
        for g in rng.sample(range(GROUPS), GROUPS_PER_ENDPOINT):
            _store(index, e.id, groups[g])
            for _ in range(USERS_PER_ENDPOINT // GROUPS_PER_ENDPOINT):
                _store(index, e.id, groups[g] + _keys(rng, USER_BLOCKS))
        tracker.record_scrape(
            e.id,
            EngineMetrics(
                waiting=rng.randrange(0, 8),
                running=rng.randrange(0, 64),
                kv_usage=rng.random(),
                weights_version="v1",
                admission_open=True,
            ),
            at=0.0,
        )
        for _ in range(rng.randrange(0, 16)):
            tracker.begin(e.id)
    return Fleet(EndpointSnapshot(tuple(endpoints)), index, tracker, groups)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_fleet(n: int, picks: int, seed: int, max_entries: int) -> dict[str, Any]:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    fleet = build_fleet(n, rng, max_entries)
    setup_s = time.perf_counter() - t0
    scheduler = Scheduler(RouterSettings(max_index_entries=max_entries))
    requests = [
        RequestFeatures(
            request_id=f"r{i}",
            prompt_tokens=(SYSTEM_BLOCKS + USER_BLOCKS) * BLOCK + 7,
            block_keys=tuple(fleet.groups[rng.randrange(GROUPS)] + _keys(rng, USER_BLOCKS)),
        )
        for i in range(picks)
    ]
    pick_us: list[float] = []
    view_us: list[float] = []
    disaggregated = 0
    hits = 0
    for i, req in enumerate(requests):
        a = time.perf_counter()
        view = fleet.tracker.view(now=1.0)
        b = time.perf_counter()
        decision = scheduler.pick(
            req, RoutingInputs(fleet.snapshot, view, fleet.index), random.Random(i)
        )
        c = time.perf_counter()
        view_us.append((b - a) * 1e6)
        pick_us.append((c - b) * 1e6)
        disaggregated += decision.prefill is not None
        hits += decision.cached_blocks > 0
    stats = fleet.index.stats()
    return {
        "endpoints": n,
        "picks": picks,
        "pick_p50_us": statistics.median(pick_us),
        "pick_p99_us": _pct(pick_us, 0.99),
        "pick_max_us": max(pick_us),
        "view_p50_us": statistics.median(view_us),
        "view_p99_us": _pct(view_us, 0.99),
        "index_entries": stats.entries,
        "index_evictions": stats.evictions,
        "prefix_hit_rate": hits / picks,
        "disaggregated_rate": disaggregated / picks,
        "setup_s": setup_s,
    }


def bench_hashing(repeats: int) -> dict[str, float]:
    hasher = PrefixHasher(BLOCK, seed="0")
    tokens = list(range((SYSTEM_BLOCKS + USER_BLOCKS) * BLOCK))
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        features_from_tokens(f"h{r}", tokens, hasher)
        times.append((time.perf_counter() - start) * 1e6)
    return {"prompt_tokens": len(tokens), "p50_us": statistics.median(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--picks", type=int, default=2000)
    parser.add_argument("--max-entries", type=int, default=RouterSettings().max_index_entries)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/router_overhead.json")
    args = parser.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        rows.append(bench_fleet(n, args.picks, args.seed, args.max_entries))
        print(f"  {n} endpoints done", file=sys.stderr)
    hashing = bench_hashing(20)
    header = (
        f"{'endpoints':>9} {'pick p50':>9} {'pick p99':>9} {'pick max':>9} "
        f"{'view p50':>9} {'entries':>9} {'evicted':>9} {'hits':>5} {'P/D':>5}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['endpoints']:>9} {r['pick_p50_us']:>7.0f}µs {r['pick_p99_us']:>7.0f}µs "
            f"{r['pick_max_us']:>7.0f}µs {r['view_p50_us']:>7.0f}µs {r['index_entries']:>9} "
            f"{r['index_evictions']:>9} {r['prefix_hit_rate']:>5.2f} "
            f"{r['disaggregated_rate']:>5.2f}"
        )
    print(
        f"hashing a {hashing['prompt_tokens']}-token prompt (per request, any fleet size): "
        f"{hashing['p50_us'] / 1000:.2f} ms p50"
    )
    target = next((r for r in rows if r["endpoints"] == 100), None)
    if target is not None:
        verdict = "met" if target["pick_p99_us"] < 1000 else "MISSED"
        print(f"target pick p99 < 1 ms at 100 endpoints: {verdict}")
    result = {
        "bench": "router_overhead",
        "command": " ".join(["bench/router_overhead.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "config": {
            "block_size": BLOCK,
            "groups": GROUPS,
            "system_tokens": SYSTEM_BLOCKS * BLOCK,
            "user_tokens": USER_BLOCKS * BLOCK,
            "groups_per_endpoint": GROUPS_PER_ENDPOINT,
            "max_index_entries": args.max_entries,
        },
        "fleets": rows,
        "hashing": hashing,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
