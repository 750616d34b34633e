"""Autoscaling at a scale this machine cannot run: a bursty agentic trace replayed against a
simulated P/D fleet (in-process workers with a service-time model calibrated from this
machine's measurements) under five policies — Loom's planner (the real `plan_autoscale` fed by
the real `role_signals`) with the card's capacity declared and without it, a fixed fleet at the
peak size, one at the mean size, and a queue-depth threshold scaler (KEDA on
vllm:num_requests_waiting) — and three oracles that read the trace's offered load (what
measuring it, knowing each half-minute's from its start, or forecasting it a worker start
ahead could reach at best), compared on SLO attainment and replica-seconds. Deterministic
(seeded); writes bench/results/autoscale.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench.autoscale_sim.fleet import Fleet
from bench.autoscale_sim.policies import Fixed, Oracle, Planner, Policy, QueueThreshold
from bench.autoscale_sim.report import Slo, Summary, bin_needs, fleet_sizes, summarize
from bench.autoscale_sim.service import MODELS, ServiceModel
from bench.autoscale_sim.trace import DEFAULT_PHASES, BurstyTrace, requests

from loom_operator.api.roles import RoleName
from loom_operator.fleet.autoscale import AutoscalePolicy, Capacity, RoleBounds, Targets

ROOT = Path(__file__).resolve().parent.parent


def policies(
    args: argparse.Namespace,
    model: ServiceModel,
    peak: dict[RoleName, int],
    mean: dict[RoleName, int],
    need: dict[RoleName, list[float]],
    measured: dict[RoleName, list[float]],
    start_s: float,
) -> list[Policy]:
    # the scalers' max: the peak fleet's size unless asked (what would otherwise be provisioned)
    bounds: dict[RoleName, tuple[int, int]] = {
        "prefill": (1, args.max_prefill or peak["prefill"]),
        "decode": (1, args.max_decode or peak["decode"]),
    }
    # the card's capacity section, as profiling one worker of the model would give it
    itl_s = args.itl_ms / 1000
    capacity = Capacity(prefill_tokens_s=model.prefill_tokens_per_s(),
                        decode_tokens_s=model.decode_tokens_per_s(itl_s),
                        decode_sequences=model.batch_within(itl_s),
                        utilization=args.utilization)  # fmt: skip
    card = AutoscalePolicy(
        roles={r: RoleBounds(lo, hi) for r, (lo, hi) in bounds.items()},
        targets=Targets(ttft_p90_s=args.ttft_ms / 1000, itl_p90_s=args.itl_ms / 1000,
                        queue=args.queue),
        capacity=capacity,
        scale_up_s=args.scale_up_s,
        scale_down_s=args.scale_down_s,
    )  # fmt: skip
    return [
        Planner(card),
        Planner(replace(card, capacity=Capacity()), name="planner-latency"),
        Fixed("fixed-peak", peak),
        Fixed("fixed-mean", mean),
        QueueThreshold(bounds, threshold=args.queue),
        Oracle("oracle-reactive", need, headroom=args.oracle_headroom),
        Oracle("oracle-ahead", need, lead_s=start_s, headroom=args.oracle_headroom),
        # the offered work of the last 10 s of arrivals, in 5 s bins: what measuring the load
        # can know (the reactive oracle knows each 30 s bin whole from its first second)
        Oracle("oracle-measured", measured, lead_s=-5.0, headroom=args.oracle_headroom, bin_s=5),
    ]


def _model(args: argparse.Namespace) -> ServiceModel:
    model = MODELS[args.shape]
    return model if args.start_s is None else replace(model, start_s=args.start_s)


def run_intensity(args: argparse.Namespace, intensity: float) -> dict[str, object]:
    model = _model(args)
    trace = BurstyTrace(DEFAULT_PHASES, seed=args.seed)
    reqs = requests(trace, intensity)
    slo = Slo(args.ttft_ms / 1000, args.itl_ms / 1000)
    peak, mean = fleet_sizes(reqs, model, slo)
    need = bin_needs(reqs, model, slo)
    measured = bin_needs(reqs, model, slo, bin_s=5.0)
    rows: list[Summary] = []
    for policy in policies(args, model, peak, mean, need, measured, model.start_s):
        start = time.perf_counter()
        # the fixed fleets run their size; the scalers start at the mean size (the card's replicas)
        initial = dict(policy.sizes) if isinstance(policy, Fixed) else dict(mean)
        rows.append(summarize(Fleet(model, policy, initial).run(reqs), slo))
        print(f"  {intensity:g}x {policy.name}: {time.perf_counter() - start:.1f} s", flush=True)
    base = next(r for r in rows if r.policy == "fixed-peak").total_replica_seconds
    return {
        "intensity": intensity,
        "requests": len(reqs),
        "trace_s": trace.seconds,
        "sizes": {"peak": peak, "mean": mean},
        "policies": [
            {**asdict(r), "total_replica_seconds": r.total_replica_seconds,
             "of_peak": r.total_replica_seconds / base}
            for r in rows
        ],
    }  # fmt: skip


def table(results: list[dict[str, object]]) -> str:
    lines = [
        "| trace | policy | SLO attainment | TTFT p90 (s) | ITL p90 (ms) | replica-s prefill "
        "| replica-s decode | replica-s total | of peak fleet's | most replicas (P/D) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for p in res["policies"]:  # type: ignore[attr-defined]
            rs, most = p["replica_seconds"], p["max_replicas"]
            lines.append(
                f"| {res['intensity']:g}x ({res['requests']} req) | {p['policy']} "
                f"| {p['attainment']:.1f} % | {p['ttft_p90_s']:.2f} | {p['itl_p90_s'] * 1000:.1f} "
                f"| {rs['prefill']:.0f} | {rs['decode']:.0f} | {p['total_replica_seconds']:.0f} "
                f"| {p['of_peak']:.0%} | {most['prefill']} / {most['decode']} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--intensities", default="1,2", help="multiples of the trace's rate")
    parser.add_argument("--ttft-ms", type=float, default=1000.0, help="SLO and planner target")
    parser.add_argument("--itl-ms", type=float, default=25.0, help="SLO and planner target")
    parser.add_argument("--queue", type=float, default=4.0, help="waiting per worker target")
    parser.add_argument(
        "--utilization",
        type=float,
        default=0.5,
        help="the planner's capacity.utilization (the card's default 0.5)",
    )
    parser.add_argument("--scale-up-s", type=float, default=30.0)
    parser.add_argument("--scale-down-s", type=float, default=300.0)
    parser.add_argument("--max-prefill", type=int, help="the scalers' max (default: peak size)")
    parser.add_argument("--max-decode", type=int, help="the scalers' max (default: peak size)")
    parser.add_argument("--start-s", type=float, help="a new worker's start delay (s)")
    parser.add_argument(
        "--oracle-headroom",
        type=float,
        default=1.5,
        help="the oracles' fleet over the offered work (default 1.5)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/autoscale.json")
    args = parser.parse_args()
    results = [run_intensity(args, float(x)) for x in args.intensities.split(",")]
    print(table(results))
    args.out.write_text(json.dumps({
        "command": "bench/autoscale.py " + " ".join(sys.argv[1:]),
        "shape": args.shape,
        "calibration": MODELS[args.shape].calibration,
        "service_model": asdict(_model(args)),
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
