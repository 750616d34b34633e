"""The planner's decisions, as tables: each role answers to its own signals (P/D-aware), steps
are bounded, the card's bounds win, the windows stop flapping, growth waits for starting workers
and schedulable pods, and a request held for a role with no worker starts one at once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loom_operator.api.roles import RoleName
from loom_operator.fleet.autoscale import (
    AutoscalePolicy,
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
