"""The planner's decisions, as tables: each role answers to its own signals (P/D-aware), the
offered load against a declared capacity sizes a role before its latency moves (the pressures
staying the safety net, an unknown capacity the old behaviour), steps are bounded, the card's
bounds win, the windows stop flapping, growth waits for starting workers and schedulable pods
unless the load needs it, and a request held for a role with no worker starts one at once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from loom_operator.api.roles import RoleName
from loom_operator.fleet.autoscale import (
    AutoscalePolicy,
    Capacity,
    Recommendation,
    RoleBounds,
    RoleDecision,
    RoleSignals,
    Targets,
    plan_autoscale,
)

TARGETS = Targets(ttft_p90_s=0.5, itl_p90_s=0.05, queue=4.0, kv_usage=0.8, prefill_tokens=8192)
POLICY = AutoscalePolicy(
    roles={"prefill": RoleBounds(1, 8), "decode": RoleBounds(1, 8), "aggregated": RoleBounds(0, 6)},
    targets=TARGETS,
    scale_up_s=0.0,
    scale_down_s=0.0,
)
T0 = 1000.0


def at_target(role: RoleName, replicas: int = 2) -> RoleSignals:
    """Every signal of the role a little under its target: no change."""
    return RoleSignals(
        role, replicas, replicas, waiting=3.6 * replicas, kv_usage=0.76, prefill_tokens=0,
        ttft_p90_s=0.47, itl_p90_s=0.047,
    )  # fmt: skip


def once(signals: RoleSignals, policy: AutoscalePolicy = POLICY) -> RoleDecision:
    """A decision with the windows' history already older than the windows."""
    history = {signals.role: (Recommendation(T0 - 10_000, signals.replicas),)}
    plan = plan_autoscale(policy, [signals], history, T0)
    (decision,) = plan.decisions
    return decision


CASES = [
    # (what, signals, desired, reason)
    ("prefill at target", at_target("prefill"), 2, "AtTarget"),
    ("prefill: TTFT twice its target doubles it", replace(at_target("prefill"), ttft_p90_s=1.0),
     4, "TtftAboveTarget"),
    ("prefill: a prompt backlog grows it",
     replace(at_target("prefill"), prefill_tokens=3 * 8192.0), 3, "PrefillBacklog"),
    ("prefill ignores ITL and KV", replace(at_target("prefill"), itl_p90_s=9.0, kv_usage=1.0),
     2, "AtTarget"),
    ("decode: ITL 1.5x its target grows it by half", replace(at_target("decode"), itl_p90_s=0.075),
     3, "ItlAboveTarget"),
    ("decode: KV pressure grows it", replace(at_target("decode"), kv_usage=1.0), 3, "KvPressure"),
    ("decode ignores TTFT and the prompt backlog",
     replace(at_target("decode"), ttft_p90_s=9.0, prefill_tokens=1e6), 2, "AtTarget"),
    ("aggregated answers to TTFT", replace(at_target("aggregated"), ttft_p90_s=1.0), 4,
     "TtftAboveTarget"),
    ("aggregated answers to ITL", replace(at_target("aggregated"), itl_p90_s=0.1), 4,
     "ItlAboveTarget"),
    ("a queue over its target grows any role", replace(at_target("decode"), waiting=16.0), 4,
     "QueueAboveTarget"),
    ("at most double in one step", replace(at_target("decode", 1), itl_p90_s=0.5), 2,
     "ItlAboveTarget"),
    ("never above the card's max", replace(at_target("decode", 6), itl_p90_s=0.5), 8, "AtMax"),
    ("down by one at a time", RoleSignals("decode", 5, 5, itl_p90_s=0.001), 4, "BelowTarget"),
    ("an idle role steps down", RoleSignals("prefill", 3, 3), 2, "Idle"),
    ("never below the card's min", RoleSignals("prefill", 1, 1), 1, "AtMin"),
    ("an aggregated role with min 0 reaches zero", RoleSignals("aggregated", 1, 1), 0, "Idle"),
    ("no growth while pods cannot be scheduled",
     replace(at_target("decode"), itl_p90_s=0.2, unschedulable=1), 2, "Unschedulable"),
    ("no growth while new workers start",
     replace(at_target("decode", 4), ready=2, itl_p90_s=0.2), 4, "WaitingForWorkers"),
    ("a held request starts a worker from zero", RoleSignals("aggregated", 0, 0, held=3), 1,
     "ScaleFromZero"),
    ("zero stays zero with nothing waiting", RoleSignals("aggregated", 0, 0), 0, "Idle"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "signals", "desired", "reason"), CASES, ids=[c[0] for c in CASES])
def test_a_round_decides_each_case(
    what: str, signals: RoleSignals, desired: int, reason: str
) -> None:
    decision = once(signals)
    assert (decision.desired, decision.reason) == (desired, reason), decision.message
    assert decision.message


def test_prefill_and_decode_are_decided_apart() -> None:
    prefill_heavy = [replace(at_target("prefill"), ttft_p90_s=1.5), at_target("decode")]
    history = {r: (Recommendation(T0 - 10_000, 2),) for r in ("prefill", "decode")}
    plan = plan_autoscale(POLICY, prefill_heavy, history, T0)  # type: ignore[arg-type]
    assert {d.role: d.desired for d in plan.decisions} == {"prefill": 4, "decode": 2}
    decode_heavy = [at_target("prefill"), replace(at_target("decode"), itl_p90_s=0.09)]
    plan = plan_autoscale(POLICY, decode_heavy, history, T0)  # type: ignore[arg-type]
    assert {d.role: d.desired for d in plan.decisions} == {"prefill": 2, "decode": 4}


def test_a_role_the_card_does_not_name_keeps_its_replicas() -> None:
    policy = replace(POLICY, roles={"decode": RoleBounds(1, 4)})
    plan = plan_autoscale(policy, [replace(at_target("prefill"), ttft_p90_s=5.0)], {}, T0)
    assert plan.decisions == () and plan.history == {}


def run_rounds(
    policy: AutoscalePolicy, ratios: list[float], start: int, every_s: float = 5.0
) -> list[int]:
    """Rounds every `every_s` of a decode role whose ITL is `ratio` × its target (the workers
    become ready at once); the replicas after each round."""
    assert TARGETS.itl_p90_s is not None
    history: dict[RoleName, tuple[Recommendation, ...]] = {}
    replicas, out = start, []
    for i, ratio in enumerate(ratios):
        signals = RoleSignals("decode", replicas, replicas, itl_p90_s=ratio * TARGETS.itl_p90_s)
        plan = plan_autoscale(policy, [signals], history, T0 + i * every_s)
        history = dict(plan.history)
        replicas = plan.decisions[0].desired
        out.append(replicas)
    return out


def test_the_windows_stop_a_noisy_signal_from_flapping() -> None:
    policy = replace(POLICY, scale_up_s=15.0, scale_down_s=60.0)
    noisy = [1.6, 0.4] * 20  # above and below its target every other round
    replicas = run_rounds(policy, noisy, start=3)
    assert replicas == [3] * len(noisy)  # neither window ever sees a lasting signal
    without = run_rounds(POLICY, noisy, start=3)
    assert len({*without}) > 1  # the same signal with no windows does flap


def test_a_lasting_rise_grows_after_the_up_window_and_a_lull_shrinks_after_the_down_window() -> (
    None
):
    policy = replace(POLICY, scale_up_s=15.0, scale_down_s=60.0)
    replicas = run_rounds(policy, [2.0] * 6 + [0.2] * 20, start=2)
    assert replicas[:3] == [2, 2, 2]  # t = 0, 5, 10: the first look holds, then the window
    assert replicas[3] == 4 and max(replicas) <= 8
    first_down = next(i for i, r in enumerate(replicas) if i > 5 and r < replicas[5])
    assert (first_down - 5) * 5.0 >= 60.0  # a down window after the last loud recommendation
    steps = [b - a for a, b in zip(replicas[first_down - 1 :], replicas[first_down:], strict=False)]
    assert all(step in (0, -1) for step in steps)  # then one at a time


def test_a_spike_in_the_down_window_cancels_the_scale_down() -> None:
    policy = replace(POLICY, scale_down_s=60.0)
    replicas = run_rounds(policy, [0.2] * 14 + [1.0] + [0.2] * 3, start=4)
    assert replicas[13] == 3  # quiet for more than the window: one down
    assert replicas[14:] == [3, 3, 3, 3]  # the spike's recommendation holds the window


def test_a_first_look_holds_for_the_windows_but_not_a_held_request() -> None:
    policy = replace(POLICY, scale_up_s=15.0, scale_down_s=60.0)
    plan = plan_autoscale(policy, [RoleSignals("decode", 3, 3)], {}, T0)
    assert plan.decisions[0].desired == 3 and plan.decisions[0].reason == "StabilisingDown"
    held = RoleSignals("aggregated", 0, 0, held=1)
    plan = plan_autoscale(policy, [held], {}, T0)
    assert plan.decisions[0].desired == 1


def test_windows_no_longer_than_a_round_still_let_an_idle_role_shrink() -> None:
    """With both windows at the round's period every older recommendation is outside them:
    that is not a first look (which holds), so the idle role steps down."""
    policy = replace(POLICY, scale_up_s=5.0, scale_down_s=5.0)
    replicas = run_rounds(policy, [0.0] * 4, start=3)
    assert replicas[0] == 3 and replicas[1:] == [2, 1, 1]


def test_the_history_is_bounded_by_the_longer_window() -> None:
    policy = replace(POLICY, scale_up_s=15.0, scale_down_s=60.0)
    history: dict[RoleName, tuple[Recommendation, ...]] = {}
    for i in range(1000):
        plan = plan_autoscale(policy, [at_target("decode")], history, T0 + i)
        history = dict(plan.history)
    assert len(history["decode"]) <= 61


# each prefill worker plans for 500 prompt tokens/s, each decode worker for 100 tokens/s and
# 5 sequences
LOADED = replace(POLICY, capacity=Capacity(prefill_tokens_s=1000.0, decode_tokens_s=200.0,
                                            decode_sequences=10.0, utilization=0.5))  # fmt: skip


def load(role: RoleName, replicas: int = 2, **signals: Any) -> RoleSignals:
    """A role at its latency targets (`at_target`) with these load signals."""
    return replace(at_target(role, replicas), **signals)


LOAD_CASES = [
    # (what, signals, desired, reason, what the message must name)
    ("a prompt-token burst grows prefill while its latency is at target",
     load("prefill", prompt_tokens_s=2000.0), 4, "PrefillLoad", "2,000 prompt"),
    ("sequences in flight grow decode while its ITL is at target",
     load("decode", sequences=15.0), 3, "DecodeLoad", "15 sequences"),
    ("a load at what the workers cover changes nothing",
     load("decode", sequences=10.0), 2, "AtTarget", "2 worker(s) needed"),
    ("growth for the load is at most double in one round",
     load("prefill", prompt_tokens_s=3500.0), 4, "PrefillLoad",
     "7 worker(s) needed: 3,500 prompt tokens/s arriving and 0 waiting (over 10 s), 500/s per "
     "worker (50% of 1,000); at most double in one round"),
    ("prompt tokens left waiting by a burst count as load to drain",
     load("prefill", 4, prompt_tokens_s=500.0, prefill_tokens=25_000.0), 6,
     "PrefillLoad", "25,000 waiting"),
    ("tokens generated per second grow decode before a queue shows",
     load("decode", generated_tokens_s=350.0, sequences=5.0), 4, "DecodeLoad",
     "350 tokens/s generated"),
    ("past saturation the sequences in flight show the load the rate cannot",
     load("decode", 4, generated_tokens_s=400.0, sequences=30.0), 6, "DecodeLoad",
     "30 sequences in flight"),
    ("growth for the load does not wait for starting workers (it counts them)",
     load("prefill", 4, ready=2, prompt_tokens_s=3500.0), 7, "PrefillLoad",
     "7 worker(s)"),
    ("growth past the load's need, from a pressure, still waits for them",
     load("prefill", 4, ready=2, ttft_p90_s=2.0, prompt_tokens_s=1000.0), 4,
     "WaitingForWorkers", "not serving yet"),
    ("latency over target with a low load: the pressure is the safety net",
     load("prefill", ttft_p90_s=1.0, prompt_tokens_s=400.0), 4, "TtftAboveTarget",
     "the load alone: 1 worker(s) needed"),
    ("a load that fell shrinks to its need at once past the window",
     load("decode", 5, sequences=4.0, itl_p90_s=0.01), 1, "DecodeLoad",
     "4 sequences"),
    ("an aggregated worker's prefill and decode shares add up",
     load("aggregated", 3, prompt_tokens_s=1500.0, sequences=5.0), 4,
     "PrefillLoad", "5 sequences"),
    ("the card's max bounds the load's need",
     load("decode", 6, sequences=100.0), 8, "AtMax", "20 worker(s)"),
    ("prefill ignores sequences, decode the prompt tokens",
     load("prefill", sequences=1e6, prompt_tokens_s=1000.0), 2, "AtTarget",
     "1,000 prompt"),
    ("capacity declared but the load not measured yet: the old behaviour",
     load("prefill", ttft_p90_s=1.0), 4, "TtftAboveTarget", "TTFT p90"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "signals", "desired", "reason", "names"), LOAD_CASES, ids=[c[0] for c in LOAD_CASES]
)
def test_the_offered_load_sizes_a_role_against_its_capacity(
    what: str, signals: RoleSignals, desired: int, reason: str, names: str
) -> None:
    decision = once(signals, LOADED)
    assert (decision.desired, decision.reason) == (desired, reason), decision.message
    assert names in decision.message


@pytest.mark.parametrize(("what", "signals", "desired", "reason"), CASES, ids=[c[0] for c in CASES])
def test_capacity_unknown_keeps_the_old_behaviour_whatever_the_load(
    what: str, signals: RoleSignals, desired: int, reason: str
) -> None:
    """The same table as without the load signals: with no capacity declared, neither prompt
    tokens arriving nor sequences in flight move a role."""
    loud = replace(signals, prompt_tokens_s=1e6, generated_tokens_s=1e6, sequences=1e6)
    decision = once(loud)
    assert (decision.desired, decision.reason) == (desired, reason), decision.message


def load_rounds(
    policy: AutoscalePolicy, sequences: list[float], start: int, every_s: float = 5.0
) -> list[tuple[int, str]]:
    """Rounds every `every_s` of a decode role whose ITL sits at its target and whose sequences
    in flight follow `sequences` (new workers serve at once); the replicas and reason after
    each round."""
    history: dict[RoleName, tuple[Recommendation, ...]] = {}
    replicas, out = start, []
    for i, n in enumerate(sequences):
        signals = replace(at_target("decode", replicas), sequences=n)
        plan = plan_autoscale(policy, [signals], history, T0 + i * every_s)
        history = dict(plan.history)
        replicas = plan.decisions[0].desired
        out.append((replicas, plan.decisions[0].reason))
    return out


def test_a_burst_in_offered_load_scales_up_before_latency_moves() -> None:
    policy = replace(LOADED, scale_up_s=10.0, scale_down_s=60.0)
    rounds = load_rounds(policy, [10.0] * 3 + [40.0] * 6, start=2)  # 2 workers, then 8 needed
    replicas = [r for r, _ in rounds]
    assert replicas[:4] == [2, 2, 2, 2]  # a first look holds; the burst's first round waits
    assert replicas[4:] == [4, 8, 8, 8, 8]  # the up window passed: double, then the need
    assert rounds[3][1] == "StabilisingUp" and rounds[4][1] == "DecodeLoad"
    # the same latencies without a capacity: nothing moves
    assert {r for r, _ in load_rounds(replace(policy, capacity=Capacity()), [40.0] * 9, 2)} == {2}


def test_offered_load_falling_scales_down_only_after_the_window_and_never_flaps() -> None:
    policy = replace(LOADED, scale_up_s=10.0, scale_down_s=60.0)
    # 8 needed; then the load falls to 2 needed, with a brief return at 30 s and round-to-round
    # noise across a worker's boundary (10 or 11 sequences: 2 or 3 workers)
    falling = [40.0] * 4 + [10.0, 11.0] * 3 + [40.0] + [10.0, 11.0] * 20
    rounds = load_rounds(policy, falling, start=8)
    replicas = [r for r, _ in rounds]
    last_loud = 10  # the brief return of the load, at 50 s
    assert replicas[: last_loud + 12] == [8] * (last_loud + 12)  # held for the 60 s window
    assert rounds[last_loud + 1][1] == "StabilisingDown"
    assert replicas[last_loud + 12] == 3  # then at once to the window's highest need
    assert set(replicas[last_loud + 12 :]) == {3}  # the noise across 2 and 3 never flaps
