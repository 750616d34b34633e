"""Weight sync under steady load: how long each strategy takes, how far throughput dips while it
runs, and the p99 latency it adds — for a P/D fleet (`loom up`, 1 prefill + N decode workers,
the tiny model) with N = 2 and 4, side by side in one run.

Per fleet size it starts one fleet, puts steady load on it (C `openai` clients streaming greedy
completions in a loop), then for each strategy: measures a baseline window, edits the card to a
new weightsVersion (checkpoints alternate between two seeds) with that strategy, and waits until
every worker serves the new version. Reported per sync:

  sync_s          card edit → every worker ready and routed on the new version
  dip             1 − (streamed tokens/s during the sync ÷ baseline tokens/s)
  worst_0.5s      lowest tokens/s over any 0.5 s slice of the sync ÷ baseline
  p99_added_s     p99 end-to-end latency of requests overlapping the sync − baseline p99
  ttft_p99_added  the same for time to first token
  failed, mixed   failed requests and streams carrying two versions (both must be 0)

Usage:
    .venv/bin/python bench/weight_sync.py --decodes 2,4 --out bench/results/weight_sync.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from run_record import RunRecord

from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import FleetProcess, run_fleet
from loom_operator.testing.load import Stream, StreamingLoad
from loom_runtime.models.tiny import init_tiny

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = tuple(
    f"Request {i}: " + "a steady stream of words for the weight sync benchmark " * (1 + i % 4)
    for i in range(16)
)
MODEL = "tiny"


@dataclass(frozen=True)
class SyncResult:
    decodes: int
    strategy: str
    from_version: str
    to_version: str
    sync_s: float
    baseline_tok_s: float
    during_tok_s: float
    dip: float
    worst_half_second: float
    p99_baseline_s: float
    p99_during_s: float
    p99_added_s: float
    ttft_p99_baseline_s: float
    ttft_p99_during_s: float
    ttft_p99_added_s: float
    requests_during: int
    failed: int
    mixed: int


def p99(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def tokens_between(streams: Sequence[Stream], a: float, b: float) -> int:
    return sum(1 for s in streams for t in s.token_times if a <= t < b)


def measure(
    streams: Sequence[Stream], t0: float, t1: float, baseline_s: float
) -> dict[str, float | int]:
    """Throughput and latency of the baseline window [t0 − baseline_s, t0) and of the sync."""
    base_tok = tokens_between(streams, t0 - baseline_s, t0) / baseline_s
    during_tok = tokens_between(streams, t0, t1) / max(t1 - t0, 1e-9)
    slices = [tokens_between(streams, a, a + 0.5) / 0.5 for a in _range(t0, t1, 0.5)]
    base = [s for s in streams if s.ok and s.started >= t0 - baseline_s and s.finished < t0]
    during = [s for s in streams if s.ok and s.started < t1 and s.finished > t0]
    lat_b, lat_d = [s.latency for s in base], [s.latency for s in during]
    ttft_b = [s.first_token - s.started for s in base if s.first_token is not None]
    ttft_d = [s.first_token - s.started for s in during if s.first_token is not None]
    return {
        "baseline_tok_s": base_tok,
        "during_tok_s": during_tok,
        "dip": 1 - during_tok / base_tok if base_tok else float("nan"),
        "worst_half_second": (min(slices) / base_tok) if slices and base_tok else float("nan"),
        "p99_baseline_s": p99(lat_b),
        "p99_during_s": p99(lat_d),
        "p99_added_s": p99(lat_d) - p99(lat_b),
        "ttft_p99_baseline_s": p99(ttft_b),
        "ttft_p99_during_s": p99(ttft_d),
        "ttft_p99_added_s": p99(ttft_d) - p99(ttft_b),
        "requests_during": len(during),
    }


def _range(a: float, b: float, step: float) -> list[float]:
    out = []
    while a + step <= b:
        out.append(a)
        a += step
    return out


def bench_fleet(
    decodes: int, strategies: Sequence[str], args: argparse.Namespace, work: Path
) -> list[SyncResult]:
    weights = [init_tiny(work / "a", seed=0), init_tiny(work / "b", seed=1)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOOM_CACHE": str(work / "cache")}
    roles = {"prefill": 1, "decode": decodes}

    def card(version: int, strategy: str) -> str:
        return card_text(
            f"file://{weights[(version - 1) % 2]}", version=f"v{version}", roles=roles,
            name=f"bench-{decodes}d", model=MODEL, strategy=strategy, dtype="fp32",
            max_num_seqs=16, min_uncached=0, drain=60,
        )  # fmt: skip

    path = work / "card.yaml"
    path.write_text(card(1, strategies[0]))
    results = []
    with (
        run_fleet(path, work / "state", env, ready_timeout=600) as fleet,
        StreamingLoad(fleet.endpoint, MODEL, PROMPTS, args.max_tokens, args.clients) as load,
    ):
        load.wait_completed(args.clients * 3, 300)  # warm: caches, steady batch
        order = [s for _ in range(args.repeats) for s in strategies]
        for version, strategy in enumerate(order, start=1):
            results.append(sync_once(fleet, load, card, version, strategy, decodes, args))
        streams = load.stop()
    failed = [s for s in streams if not s.ok]
    if failed:
        print(f"  {len(failed)} failed requests, e.g. {failed[0].error}", file=sys.stderr)
    return results


def sync_once(
    fleet: FleetProcess,
    load: StreamingLoad,
    card: Callable[[int, str], str],
    version: int,
    strategy: str,
    decodes: int,
    args: argparse.Namespace,
) -> SyncResult:
    time.sleep(args.baseline_s)  # the baseline window: steady load, nothing changing
    t0 = time.monotonic()
    fleet.edit_card(card(version + 1, strategy))
    fleet.wait_settled(600, f"v{version + 1}")
    t1 = time.monotonic()
    time.sleep(args.after_s)  # let requests that overlapped the sync finish
    streams = list(load.streams)
    m = measure(streams, t0, t1, args.baseline_s)
    window = [s for s in streams if s.started < t1 + args.after_s and s.finished > t0]
    result = SyncResult(
        decodes=decodes, strategy=strategy, from_version=f"v{version}",
        to_version=f"v{version + 1}", sync_s=t1 - t0,
        failed=sum(1 for s in window if not s.ok),
        mixed=sum(1 for s in window if s.ok and len(s.versions) != 1),
        **m,  # type: ignore[arg-type]
    )  # fmt: skip
    print(
        f"  {decodes} decode  {strategy:<8} sync {result.sync_s:5.2f}s  dip {result.dip:6.1%}  "
        f"worst 0.5s {result.worst_half_second:6.1%}  p99 +{result.p99_added_s:5.2f}s  "
        f"ttft p99 +{result.ttft_p99_added_s:5.2f}s  failed {result.failed}  mixed {result.mixed}",
        flush=True,
    )
    return result


SUMMARY = ("sync_s", "dip", "worst_half_second", "p99_added_s", "ttft_p99_added_s")


def summarize(results: Sequence[SyncResult]) -> str:
    """A markdown table: per fleet size and strategy, the median of each metric over repeats."""
    lines = [
        "| decode workers | strategy | syncs | sync (s) | throughput dip | worst 0.5 s | "
        "p99 added (s) | TTFT p99 added (s) | failed | mixed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted(
        {(r.decodes, r.strategy) for r in results}, key=lambda k: (k[0], k[1] != "Rolling")
    )
    for decodes, strategy in keys:
        group = [r for r in results if (r.decodes, r.strategy) == (decodes, strategy)]
        med = {k: statistics.median(getattr(r, k) for r in group) for k in SUMMARY}
        lines.append(
            f"| {decodes} | {strategy} | {len(group)} | {med['sync_s']:.2f} | {med['dip']:.0%} | "
            f"{med['worst_half_second']:.0%} of baseline | {med['p99_added_s']:+.2f} | "
            f"{med['ttft_p99_added_s']:+.2f} | {sum(r.failed for r in group)} | "
            f"{sum(r.mixed for r in group)} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--decodes", default="2,4", help="decode worker counts (default 2,4)")
    p.add_argument("--strategies", default="Rolling,Barrier")
    p.add_argument("--clients", type=int, default=4, help="concurrent streaming clients")
    p.add_argument("--repeats", type=int, default=2, help="syncs per strategy (median kept)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--baseline-s", type=float, default=8.0, help="baseline window (s)")
    p.add_argument("--after-s", type=float, default=3.0, help="wait after each sync (s)")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/weight_sync.json")
    args = p.parse_args()
    strategies = [s.strip() for s in args.strategies.split(",")]
    results: list[SyncResult] = []
    record = RunRecord("weight_sync")
    for n in (int(x) for x in args.decodes.split(",")):
        print(f"fleet: 1 prefill + {n} decode, {args.clients} clients", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"loom-bench-sync-{n}-") as tmp:
            results += bench_fleet(n, strategies, args, Path(tmp))
    summary = summarize(results)
    print(summary)
    record.write(
        args.out,
        settings={k: str(v) for k, v in vars(args).items()},
        results=[asdict(r) for r in results],
        summary=summary,
    )
    return 1 if any(r.failed or r.mixed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
