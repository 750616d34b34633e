"""Loom's planner: how many workers each role should run, from what the router and the workers
publish, P/D-aware — time to first token and the prefill backlog drive prefill, inter-token
latency and KV pressure drive decode, an aggregated role answers to both.

One pure decision per round over plain data: a proportional recommendation per role (as an HPA
computes one: current × the most pressing signal over its target, within a tolerance), bounded
steps (at most double up, one down), the card's bounds, stabilisation windows (the lowest
recommendation of the scale-up window, the highest of the scale-down window — so it never
flaps), no growth while pods cannot be scheduled or new workers are still starting, and scale
from zero the moment the router holds a request for a role with no worker. Never observes,
never acts: the shell feeds `RoleSignals` and applies `RoleDecision.desired` as the role's
replicas (which worker leaves is the scaling plan's drain, never a kill).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loom_operator.api.roles import RoleName

TOLERANCE = 0.1
"""A signal within 10 % of its target asks for no change (HPA's default tolerance)."""


@dataclass(frozen=True)
class RoleBounds:
    """How far the planner may move one role."""

    min: int = 1
    max: int = 1

    def clamp(self, replicas: int) -> int:
        """`replicas` within the bounds."""
        return max(self.min, min(self.max, replicas))


@dataclass(frozen=True)
class Targets:
    """What the planner holds each role to; None: that signal is not used."""

    ttft_p90_s: float | None = None
    """Prefill (and aggregated): the 90th percentile of time to first token."""
    itl_p90_s: float | None = None
    """Decode (and aggregated): the 90th percentile of inter-token latency."""
    queue: float = 4.0
    """Requests waiting per worker (in its queue, or held by the router for its role)."""
    kv_usage: float = 0.85
    """Decode (and aggregated): the fraction of KV blocks in use on the fullest worker."""
    prefill_tokens: float | None = None
    """Prefill (and aggregated): prompt tokens waiting to be prefilled per worker."""


@dataclass(frozen=True)
class AutoscalePolicy:
    """The card's autoscaling section as plain data."""

    roles: Mapping[RoleName, RoleBounds]
    """The roles the planner moves, with their bounds (a role not named keeps its replicas)."""
    targets: Targets = field(default_factory=Targets)
    scale_up_s: float = 30.0
    """Scale-up stabilisation window: growth follows the lowest recommendation within it."""
    scale_down_s: float = 300.0
    """Scale-down stabilisation window: shrinking follows the highest recommendation within it."""
    planner: bool = True
    """False: the planner does not run; an outside scaler moves the roles within the bounds."""

    def clamp(self, role: RoleName, replicas: int) -> int:
        """`replicas` within the role's bounds (unchanged for a role the policy does not name)."""
        bounds = self.roles.get(role)
        return replicas if bounds is None else bounds.clamp(replicas)


@dataclass(frozen=True)
class RoleSignals:
    """What the shell measured of one role over the last window."""

    role: RoleName
    replicas: int
    """The replicas the role is asked to run now."""
    ready: int
    """Workers of the role that serve (ready and routed)."""
    waiting: float = 0.0
    """Requests queued at its workers plus those the router holds for the role."""
    held: int = 0
    """Requests the router holds because the role has no ready worker (scale from zero)."""
    kv_usage: float = 0.0
    """The fullest worker's fraction of KV blocks in use."""
    prefill_tokens: float = 0.0
    """Prompt tokens waiting to be prefilled on the role's workers."""
    ttft_p90_s: float | None = None
    """None when no request finished its first token in the window."""
    itl_p90_s: float | None = None
    unschedulable: int = 0
    """Its pods the scheduler cannot place (no node has room): growing would not help."""


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int


@dataclass(frozen=True)
class RoleDecision:
    """What the planner decided for one role, and why (an event, a condition, a metric)."""

    role: RoleName
    current: int
    desired: int
    reason: str
    """CamelCase, for conditions and the metric's label."""
    message: str
    recommended: int
    """This round's raw recommendation, before the windows."""

    @property
    def changed(self) -> bool:
        return self.desired != self.current


@dataclass(frozen=True)
class AutoscalePlan:
    decisions: tuple[RoleDecision, ...]
    history: Mapping[RoleName, tuple[Recommendation, ...]]
    """Keep it for the next round (bounded by the longer window)."""


@dataclass(frozen=True)
class Pressure:
    """The most pressing signal of a role: its name and its value over its target."""

    ratio: float
    reason: str
    message: str


def pressure(role: RoleName, s: RoleSignals, t: Targets) -> Pressure:
    """The highest of the role's signals over their targets (0 when idle). Pure."""
    per_worker = max(s.ready, 1)
    measured: list[Pressure] = [
        Pressure(
            s.waiting / per_worker / t.queue,
            "QueueAboveTarget",
            f"{s.waiting:g} waiting on {s.ready} worker(s), target {t.queue:g} each",
        )
    ]
    if role != "decode":
        if t.ttft_p90_s is not None and s.ttft_p90_s is not None:
            measured.append(
                Pressure(
                    s.ttft_p90_s / t.ttft_p90_s,
                    "TtftAboveTarget",
                    f"TTFT p90 {s.ttft_p90_s * 1000:.0f} ms, target {t.ttft_p90_s * 1000:.0f} ms",
                )
            )
        if t.prefill_tokens is not None:
            measured.append(
                Pressure(
                    s.prefill_tokens / per_worker / t.prefill_tokens,
                    "PrefillBacklog",
                    f"{s.prefill_tokens:g} prompt tokens waiting, target "
                    f"{t.prefill_tokens:g} per worker",
                )
            )
    if role != "prefill":
        if t.itl_p90_s is not None and s.itl_p90_s is not None:
            measured.append(
                Pressure(
                    s.itl_p90_s / t.itl_p90_s,
                    "ItlAboveTarget",
                    f"ITL p90 {s.itl_p90_s * 1000:.1f} ms, target {t.itl_p90_s * 1000:.1f} ms",
                )
            )
        measured.append(
            Pressure(
                s.kv_usage / t.kv_usage,
                "KvPressure",
                f"KV {s.kv_usage:.0%} used on the fullest worker, target {t.kv_usage:.0%}",
            )
        )
    return max(measured, key=lambda p: p.ratio)


def recommend(s: RoleSignals, bounds: RoleBounds, p: Pressure) -> tuple[int, str, str]:
    """This round's replicas for one role before the windows: proportional to the pressure
    (over the workers that serve: starting ones count once they do), within the tolerance, at
    most double up and one down per round, within the bounds."""
    current = s.replicas
    if current == 0:
        if s.held > 0 or s.waiting > 0:
            n = max(1, bounds.min)
            return n, "ScaleFromZero", f"{max(s.held, int(s.waiting))} request(s) wait for a worker"
        return bounds.min, "Idle", "no worker and nothing waiting"
    if abs(p.ratio - 1.0) <= TOLERANCE:
        n, reason = current, "AtTarget"
    elif p.ratio > 1.0:
        wanted = math.ceil(max(s.ready, 1) * p.ratio - 1e-9)
        n, reason = min(max(wanted, current), 2 * current), p.reason
    else:
        wanted = math.ceil(max(s.ready, 1) * p.ratio - 1e-9)
        n, reason = max(wanted, current - 1), "Idle" if p.ratio == 0 else "BelowTarget"
    if n > bounds.max:
        return bounds.max, "AtMax", f"{p.message}; at the card's max of {bounds.max}"
    if n < bounds.min:
        return bounds.min, "AtMin", f"{p.message}; at the card's min of {bounds.min}"
    return n, reason, p.message


def _window(
    history: Sequence[Recommendation], now: float, seconds: float
) -> tuple[Recommendation, ...]:
    return tuple(r for r in history if r.at > now - seconds)


def decide(
    s: RoleSignals,
    bounds: RoleBounds,
    policy: AutoscalePolicy,
    history: Sequence[Recommendation],
    now: float,
) -> tuple[RoleDecision, tuple[Recommendation, ...]]:
    """One role's decision and its new recommendation history. Pure."""
    p = pressure(s.role, s, policy.targets)
    rec, reason, message = recommend(s, bounds, p)
    keep = max(policy.scale_up_s, policy.scale_down_s)
    # a role seen for the first time (a new card, a restarted controller) holds its replicas
    # for the windows, as if they had been recommended just now; a role whose history merely
    # fell out of windows no longer than a round does not
    seen = _window(history, now, keep) if history else (Recommendation(now, s.replicas),)
    recs = (*seen, Recommendation(now, rec))
    current = s.replicas
    up = min(r.replicas for r in _window(recs, now, policy.scale_up_s) or recs[-1:])
    down = max(r.replicas for r in _window(recs, now, policy.scale_down_s) or recs[-1:])
    if reason == "ScaleFromZero":
        desired = rec  # a held request must not wait out a window
    elif up > current:
        desired = up
        if s.unschedulable > 0:
            desired, reason = current, "Unschedulable"
            message = f"{s.unschedulable} pod(s) of {s.role} cannot be scheduled: not growing"
        elif s.ready < current:
            desired, reason = current, "WaitingForWorkers"
            message = f"{current - s.ready} new worker(s) of {s.role} not serving yet"
    elif down < current:
        desired = down
    else:
        desired = current
        if rec < current:
            reason = "StabilisingDown"
            message = f"{message}; keeping {current} for the {policy.scale_down_s:g}s window"
        elif rec > current:
            reason = "StabilisingUp"
            message = f"{message}; keeping {current} for the {policy.scale_up_s:g}s window"
    desired = bounds.clamp(desired)
    decision = RoleDecision(s.role, current, desired, reason, message, rec)
    return decision, recs


def plan_autoscale(
    policy: AutoscalePolicy,
    signals: Sequence[RoleSignals],
    history: Mapping[RoleName, tuple[Recommendation, ...]],
    now: float,
) -> AutoscalePlan:
    """A decision for every role the policy moves (prefill and decode independently). Pure."""
    decisions: list[RoleDecision] = []
    kept: dict[RoleName, tuple[Recommendation, ...]] = {}
    for s in signals:
        bounds = policy.roles.get(s.role)
        if bounds is None:
            continue
        decision, recs = decide(s, bounds, policy, history.get(s.role, ()), now)
        decisions.append(decision)
        kept[s.role] = recs
    return AutoscalePlan(tuple(decisions), kept)
