"""The autoscaling bench's simulator: its service model, and a run's attainment and
replica-seconds on a trace small enough to work out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
from bench.autoscale_sim.fleet import Fleet
from bench.autoscale_sim.policies import Fixed, Oracle, Planner, QueueThreshold, Snapshot
from bench.autoscale_sim.report import Slo, bin_needs, fleet_sizes, summarize
from bench.autoscale_sim.service import TINY
from bench.autoscale_sim.trace import BurstyTrace, Phase, Request, requests

from loom_operator.api.roles import RoleName
from loom_operator.fleet.autoscale import AutoscalePolicy, Capacity, RoleBounds, Targets

# 1 ms per prompt token, 10 ms per decode step whatever the batch, no hand-off, 10 s to start
MODEL = replace(
    TINY, prefill_step_s=0.0, prefill_token_s=0.001, prefill_budget=1000, decode_step_s=0.01,
    decode_seq_s=0.0, handoff_s=0.0, start_s=10.0,
)  # fmt: skip
# the first prompt prefilled alone (0 - 0.1 s), the next two together behind it (0.1 - 0.3 s)
TRACE = [Request(0, 0.0, 100, 11), Request(1, 0.0, 100, 21), Request(2, 0.05, 100, 2)]


def test_service_model_is_linear_in_tokens_and_batch() -> None:
    assert TINY.prefill_s(1000) == pytest.approx(0.005 + 0.145)
    assert TINY.decode_s(16) == pytest.approx(0.0051 + 16 * 0.00086)
    assert TINY.batch_within(0.025) == 23  # 5.1 + 23 x 0.86 = 24.9 ms
    assert TINY.batch_within(1.0) == TINY.max_num_seqs
    assert TINY.batch_within(0.001) == 1


def test_a_fixed_fleet_answers_the_tiny_trace_as_worked_out_by_hand() -> None:
    run = Fleet(MODEL, Fixed("fixed", {"prefill": 1, "decode": 1}), {"prefill": 1, "decode": 1})
    result = run.run(TRACE)
    got = {o.request.id: (o.ttft_s, o.itl_s, o.finish_s) for o in result.outcomes}
    assert got[0] == pytest.approx((0.1, 0.01, 0.2))  # 10 gaps of 10 ms after 0.1 s
    assert got[1] == pytest.approx((0.3, 0.01, 0.5))  # 20 gaps after 0.3 s
    assert got[2] == pytest.approx((0.25, 0.01, 0.31))  # arrived at 0.05, one gap
    assert result.end_s == pytest.approx(0.5)
    summary = summarize(result, Slo(ttft_s=0.28, itl_s=0.02))
    assert summary.attainment == pytest.approx(200 / 3)  # request 1 misses the TTFT target
    assert summary.replica_seconds == pytest.approx({"prefill": 0.5, "decode": 0.5})
    assert summarize(result, Slo(ttft_s=0.3, itl_s=0.005)).attainment == 0.0


def test_a_worker_counts_from_its_launch_not_from_when_it_serves() -> None:
    asked = Fixed("fixed", {"prefill": 1, "decode": 2})  # one more decode launched at t = 0
    result = Fleet(MODEL, asked, {"prefill": 1, "decode": 1}).run(TRACE)
    assert summarize(result, Slo(1.0, 1.0)).replica_seconds == pytest.approx(
        {"prefill": 0.5, "decode": 1.0}
    )


def test_the_real_planner_grows_a_role_whose_queue_is_over_target() -> None:
    card = AutoscalePolicy({"prefill": RoleBounds(1, 4), "decode": RoleBounds(1, 4)},
                           Targets(queue=1), scale_up_s=0.0)  # fmt: skip
    burst = [Request(i, 0.0, 900, 2) for i in range(12)]  # prefill: 10.8 s of work
    result = Fleet(MODEL, Planner(card), {"prefill": 1, "decode": 1}).run(burst)
    assert len(result.outcomes) == 12
    assert max(p for _, p, _ in result.timeline) > 1
    assert max(d for _, _, d in result.timeline) == 1  # decode never had a queue


def test_the_profiled_capacity_is_one_saturated_worker() -> None:
    assert TINY.prefill_tokens_per_s() == pytest.approx(4096 / (0.005 + 4096 * 0.000145))
    assert TINY.decode_tokens_per_s(0.025) == pytest.approx(23 / (0.0051 + 23 * 0.00086))


def test_the_planner_sizes_prefill_from_the_prompt_tokens_arriving() -> None:
    """Prompts arriving at 3x what one prefill worker plans for: the real planner, reading the
    simulated `loom:prompt_tokens_arrived`, grows prefill for that load although no latency
    target is set and the queue target is out of reach."""
    card = AutoscalePolicy({"prefill": RoleBounds(1, 8), "decode": RoleBounds(1, 8)},
                           Targets(queue=1000), Capacity(prefill_tokens_s=1000, utilization=0.5),
                           scale_up_s=0.0)  # fmt: skip
    steady = [Request(i, i * 0.1, 150, 2) for i in range(300)]  # 1,500 prompt tokens/s
    result = Fleet(MODEL, Planner(card), {"prefill": 1, "decode": 1}).run(steady)
    assert len(result.outcomes) == 300
    # 1,500 / 500 per worker, and more while the backlog the first worker built drains
    assert max(p for _, p, _ in result.timeline) >= 3
    assert max(d for _, _, d in result.timeline) == 1  # no decode capacity: decode unmoved


def test_queue_threshold_scaler_follows_the_hpa_formula() -> None:
    keda = QueueThreshold({"decode": (1, 10)}, threshold=4.0)
    assert keda._one("decode", 2, 20, 0.0, 1, 10) == 5  # ceil(20 / 4)
    assert keda._one("decode", 1, 40, 0.0, 1, 10) == 5  # at most +4 from 1
    assert keda._one("decode", 5, 0, 100.0, 1, 10) == 5  # the down window holds 5 until 300 s
    assert keda._one("decode", 5, 0, 301.0, 1, 10) == 1


def test_the_bursty_trace_is_seeded_and_grows_each_sessions_context() -> None:
    trace = BurstyTrace((Phase(60, 0.5), Phase(30, 2.0)), groups=2, turns=2, system_tokens=10,
                        user_tokens=3, think_s=1.0, output_tokens=(1, 4), seed=3)  # fmt: skip
    reqs = requests(trace)
    assert reqs == requests(trace)
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    assert {r.prompt_tokens for r in reqs} >= {13}  # a first turn: system + one message
    assert all(13 <= r.prompt_tokens <= 10 + 3 + 4 + 3 for r in reqs)
    assert len(requests(trace, 2.0)) > len(reqs)


def test_the_oracles_ask_for_the_offered_work_of_the_bin_under_way_or_ahead() -> None:
    need: dict[RoleName, list[float]] = {"prefill": [1.0, 4.0, 2.0], "decode": [2.0, 2.0, 6.0]}
    reactive, ahead = Oracle("r", need, headroom=1.5), Oracle("a", need, lead_s=40, headroom=1.5)

    def at(now: float) -> Snapshot:
        return Snapshot(now, {"prefill": 1, "decode": 1}, (), {}, {})

    assert reactive.decide(at(5)) == {"prefill": 2, "decode": 3}  # bin 0: 1.5 x 1, 1.5 x 2
    assert reactive.decide(at(35)) == {"prefill": 6, "decode": 3}  # bin 1 (and 0 before it)
    assert ahead.decide(at(35)) == {"prefill": 6, "decode": 9}  # bin 2, 40 s ahead
    assert reactive.decide(at(95)) == {"prefill": 3, "decode": 9}  # past the trace: the last bin


def test_bin_needs_size_the_fixed_fleets() -> None:
    slo = Slo(1.0, 0.025)
    need = bin_needs(TRACE, TINY, slo, bin_s=30.0, util=0.5)
    assert need["prefill"] == [pytest.approx(TINY.prefill_token_s * 300 / 30 / 0.5)]
    tok_s = 23 / TINY.decode_s(23)  # the largest batch within 25 ms
    assert need["decode"] == [pytest.approx(34 / tok_s / 30 / 0.5)]
    assert fleet_sizes(TRACE, TINY, slo) == ({"prefill": 1, "decode": 1},
                                             {"prefill": 1, "decode": 1})  # fmt: skip
