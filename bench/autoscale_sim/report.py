"""What a run is judged by: SLO attainment (the share of requests within both the TTFT and the
ITL target), p90 TTFT and ITL, replica-seconds; and the fixed fleets' sizes from the trace's
offered load.

Pure functions over outcomes and requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.autoscale_sim.fleet import Outcome, RunResult
from bench.autoscale_sim.service import ServiceModel
from bench.autoscale_sim.trace import Request

from loom_operator.api.roles import RoleName


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    itl_s: float
    """A request's mean inter-token latency (TPOT) must stay within this."""


@dataclass(frozen=True)
class Summary:
    policy: str
    requests: int
    attainment: float
    """Percent of requests within both targets."""
    ttft_p90_s: float
    itl_p90_s: float
    replica_seconds: dict[RoleName, float]
    max_replicas: dict[RoleName, int]

    @property
    def total_replica_seconds(self) -> float:
        return sum(self.replica_seconds.values())


def p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def attained(o: Outcome, slo: Slo) -> bool:
    return o.ttft_s <= slo.ttft_s and o.itl_s <= slo.itl_s


def summarize(run: RunResult, slo: Slo) -> Summary:
    n = len(run.outcomes)
    ok = sum(1 for o in run.outcomes if attained(o, slo))
    most: dict[RoleName, int] = {"prefill": 0, "decode": 0}
    for _, p, d in run.timeline:
        most = {"prefill": max(most["prefill"], p), "decode": max(most["decode"], d)}
    return Summary(
        run.policy, n, 100.0 * ok / n if n else 100.0,
        p90([o.ttft_s for o in run.outcomes]), p90([o.itl_s for o in run.outcomes]),
        dict(run.replica_seconds), most,
    )  # fmt: skip


def bin_needs(
    requests: list[Request], model: ServiceModel, slo: Slo, bin_s: float = 30.0, util: float = 0.8
) -> dict[RoleName, list[float]]:
    """Per `bin_s` of arrivals, the workers of each role whose prefill time and decode
    throughput (at the largest batch within the ITL target) cover the bin's work at `util`."""
    tok_s = model.decode_tokens_per_s(slo.itl_s)
    bins = int(max(r.arrival_s for r in requests) // bin_s) + 1
    prefill, decode = [0.0] * bins, [0.0] * bins
    for r in requests:
        i = int(r.arrival_s // bin_s)
        prefill[i] += model.prefill_token_s * r.prompt_tokens
        decode[i] += r.output_tokens / tok_s
    return {
        "prefill": [s / bin_s / util for s in prefill],
        "decode": [s / bin_s / util for s in decode],
    }


def fleet_sizes(
    requests: list[Request], model: ServiceModel, slo: Slo, bin_s: float = 30.0, util: float = 0.8
) -> tuple[dict[RoleName, int], dict[RoleName, int]]:
    """The fixed fleets (peak, mean) from `bin_needs`: peak is the largest bin's, the mean fleet
    the mean over bins, rounded up."""
    need = bin_needs(requests, model, slo, bin_s, util)
    peak = {role: math.ceil(max(n)) for role, n in need.items()}
    mean = {role: max(1, math.ceil(sum(n) / len(n))) for role, n in need.items()}
    return peak, mean
