"""How long the router's pure core takes to pick an endpoint, at 10, 100 and 1,000 endpoints.

Each fleet is 3/4 decode and 1/4 prefill endpoints with realistic state: a precise prefix index
holding, per endpoint, the KV chains of a few of 150 shared 6k-token system prompts plus user
turns (the llm-d benchmark's shape: 150 groups sharing 6k-token prompts), fresh metrics and
in-flight counts for every endpoint. Requests are a group's system prompt plus a 512-token user
turn. Reported per fleet size: the pick itself (filters → hot-spot rule → scorers → picker →
P/D decider) p50/p99/max, building the load view for a pick, and, once, hashing a 6.5k-token
prompt the way the engine does (per request, independent of fleet size; the proxy shell runs it
off the event loop). Target: pick p99 < 1 ms at 100 endpoints.

Proxy overhead: requests/s through the real router process versus straight to the worker, with
a stub worker (a test double that answers at once with canned bodies, so what is measured is
the router's cost alone: parsing, picking, relaying, and for streams re-encoding each chunk),
non-streamed and streamed (16 chunks), at concurrency 1 (added latency) and 16 (throughput),
plus the router process's CPU time per request (user + system, from /proc: steadier than
requests/s on a shared 2-core machine). `--router-tree DIR` runs the router from another
checkout (e.g. a worktree of an older commit) for before/after comparisons of the proxy.
Usage:

    OMP_NUM_THREADS=1 .venv/bin/python bench/router_overhead.py \
        --out bench/results/router_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loom_router.core.endpoints import Endpoint, EndpointSnapshot
from loom_router.core.kv_events import DecodedBatch
from loom_router.core.load import EngineMetrics, LoadTracker
from loom_router.core.pipeline import EndpointPicker, RoutingInputs
from loom_router.core.prefix_index import PrefixIndex
from loom_router.core.request import RequestFeatures, features_from_tokens
from loom_router.core.settings import RoutingSettings
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
    picker = EndpointPicker(RoutingSettings(max_index_entries=max_entries))
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
        decision = picker.pick(
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


# --- proxy overhead: router vs direct, against a stub worker ----------------------------------

STUB_CHUNKS = 16
STUB_MODEL = "stub"


def serve_stub(port: int) -> None:
    """A stub worker (test double): answers /v1/completions at once, JSON or 16 SSE chunks."""
    from aiohttp import web

    head = {
        "id": "cmpl-stub",
        "object": "text_completion",
        "created": 0,
        "model": STUB_MODEL,
        "system_fingerprint": "v1",
    }
    usage = {"prompt_tokens": 8, "completion_tokens": STUB_CHUNKS, "total_tokens": 24}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        headers = {"x-loom-weights-version": "v1"}
        if not body.get("stream"):
            choice = {
                "index": 0,
                "text": "x" * STUB_CHUNKS,
                "finish_reason": "length",
                "logprobs": None,
            }
            return web.json_response({**head, "choices": [choice], "usage": usage}, headers=headers)
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(STUB_CHUNKS):
            choice = {
                "index": 0,
                "text": "x",
                "logprobs": None,
                "token_ids": [100 + i],
                "finish_reason": "length" if i == STUB_CHUNKS - 1 else None,
            }
            if i == 0:
                choice["prompt_token_ids"] = list(range(8))
            await resp.write(
                b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n"
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def metrics(_: web.Request) -> web.Response:
        text = (
            "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
        )
        return web.Response(text=text)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")


async def _drive(url: str, stream: bool, requests: int, concurrency: int) -> dict[str, float]:
    import aiohttp

    body = {
        "model": STUB_MODEL,
        "prompt": "a short prompt",
        "max_tokens": STUB_CHUNKS,
        "stream": stream,
    }
    latencies: list[float] = []
    left = [requests]
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def client() -> None:
            while left[0] > 0:
                left[0] -= 1
                start = time.perf_counter()
                async with http.post(url + "/v1/completions", json=body) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {"requests_per_s": requests / wall, "p50_ms": statistics.median(latencies) * 1e3}


def bench_proxy(requests: int, router_tree: Path = ROOT) -> list[dict[str, Any]]:
    """Router vs direct against the stub worker, in requests/s, latency p50 and the router's
    CPU time per request; the router runs from `router_tree`'s sources."""
    from loom_runtime.testing.processes import free_ports

    stub_port, port, admin = free_ports(3)
    stub_url, router_url = f"http://127.0.0.1:{stub_port}", f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "router.json"
        config.write_text(
            json.dumps(
                {
                    "model_name": STUB_MODEL,
                    "endpoints": [
                        {
                            "id": "stub",
                            "url": stub_url,
                            "role": "aggregated",
                            "weights_version": "v1",
                        }
                    ],
                }
            )
        )
        stub = subprocess.Popen([sys.executable, __file__, "--serve-stub", str(stub_port)])
        paths = [router_tree / part for part in ("runtime", "operator", "router", ".")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, paths)))
        router = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loom_router",
                "--config",
                str(config),
                "--port",
                str(port),
                "--admin-port",
                str(admin),
                "--admin-token",
                "bench",
                "--log-level",
                "WARNING",
            ],
            env=env,
        )
        try:
            _wait_up(stub_url + "/health", stub)
            _wait_up(router_url + "/ready", router)
            rows = []
            for stream in (False, True):
                for concurrency in (1, 16):
                    n = requests if concurrency > 1 else requests // 4
                    asyncio.run(_drive(stub_url, stream, 50, concurrency))  # warm up
                    asyncio.run(_drive(router_url, stream, 50, concurrency))
                    direct = asyncio.run(_drive(stub_url, stream, n, concurrency))
                    cpu_before = _cpu_seconds(router.pid)
                    routed = asyncio.run(_drive(router_url, stream, n, concurrency))
                    router_cpu = _cpu_seconds(router.pid) - cpu_before
                    rows.append(
                        {
                            "stream": stream,
                            "concurrency": concurrency,
                            "requests": n,
                            "direct_rps": direct["requests_per_s"],
                            "router_rps": routed["requests_per_s"],
                            "router_vs_direct": routed["requests_per_s"] / direct["requests_per_s"],
                            "direct_p50_ms": direct["p50_ms"],
                            "router_p50_ms": routed["p50_ms"],
                            "added_p50_ms": routed["p50_ms"] - direct["p50_ms"],
                            "router_cpu_us_per_request": router_cpu / n * 1e6,
                        }
                    )
            return rows
        finally:
            for proc in (router, stub):
                proc.terminate()
                proc.wait(timeout=30)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-stub":
        serve_stub(int(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--picks", type=int, default=2000)
    parser.add_argument("--max-entries", type=int, default=RoutingSettings().max_index_entries)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--proxy-requests", type=int, default=2000, help="0 skips the proxy part")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/router_overhead.json")
    parser.add_argument(
        "--router-tree",
        type=Path,
        default=ROOT,
        help="run the proxy part's router from this checkout (before/after comparisons)",
    )
    args = parser.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",") if s):
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
    if args.proxy_requests > 0:
        proxy = bench_proxy(args.proxy_requests, args.router_tree.resolve())
        print(
            f"{'stream':>6} {'conc':>4} {'direct rps':>10} {'router rps':>10} {'ratio':>6} "
            f"{'added p50':>9} {'router CPU/req':>14}"
        )
        for r in proxy:
            print(
                f"{r['stream']!s:>6} {r['concurrency']:>4} {r['direct_rps']:>10.0f} "
                f"{r['router_rps']:>10.0f} {r['router_vs_direct']:>6.2f} "
                f"{r['added_p50_ms']:>7.2f}ms {r['router_cpu_us_per_request']:>12.0f}µs"
            )
        result["proxy"] = proxy
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
