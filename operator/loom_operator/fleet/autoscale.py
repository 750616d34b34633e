"""Loom's planner: how many workers each role should run, from what the router and the workers
publish, P/D-aware — the offered load against a worker's profiled capacity sizes each role
(prompt tokens arriving per second for prefill, sequences in flight for decode); time to first
token and the prefill backlog press on prefill, inter-token latency and KV pressure on decode,
an aggregated role answers to both.

One pure decision per round over plain data: the workers the offered load needs (when the card
declares the capacity), and a proportional recommendation per role as the safety net (as an HPA
computes one: current × the most pressing signal over its target, within a tolerance), bounded
steps (at most double up; one down without a capacity), the card's bounds, stabilisation
windows (the lowest
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

AUTOSCALING = "Autoscaling"
"""The card's condition: True while Loom's planner moves its roles, with its latest reason."""
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
class Capacity:
    """What one worker serves within the targets, as profiled; None: unknown, so the role is
    sized by its latency and queue pressures alone."""

    prefill_tokens_s: float | None = None
    """Prefill (and aggregated): prompt tokens one worker prefills per second."""
    decode_tokens_s: float | None = None
    """Decode (and aggregated): tokens one worker generates per second within the ITL target."""
    decode_sequences: float | None = None
    """Decode (and aggregated): sequences one worker runs at once within the ITL target."""
    utilization: float = 0.5
    """The share of the capacity the planner sizes for."""
    drain_s: float = 10.0
    """Prompt tokens waiting to be prefilled count as load served within this time, beside the
    arrivals (a backlog left by a burst drains instead of lingering at the TTFT's cost)."""


@dataclass(frozen=True)
class AutoscalePolicy:
    """The card's autoscaling section as plain data."""

    roles: Mapping[RoleName, RoleBounds]
    """The roles the planner moves, with their bounds (a role not named keeps its replicas)."""
    targets: Targets = field(default_factory=Targets)
    capacity: Capacity = field(default_factory=Capacity)
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
    prompt_tokens_s: float | None = None
    """Offered prefill load: prompt tokens arriving per second at the role's workers over the
    rate window (None: no worker measured it yet)."""
    generated_tokens_s: float | None = None
    """Decode load: tokens generated per second by the role's workers over the rate window
    (what they serve: the offered load until they saturate; None: not measured yet)."""
    sequences: float = 0.0
    """Decode load: sequences in flight on the role's workers (running or waiting) plus the
    requests the router holds for it (it shows the load past saturation, as a queue)."""
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

    def said(self) -> str:
        if self.changed:
            return f"{self.role} {self.current} → {self.desired} ({self.reason}: {self.message})"
        return f"{self.role} {self.desired} ({self.reason}: {self.message})"


@dataclass(frozen=True)
class AutoscalePlan:
    decisions: tuple[RoleDecision, ...]
    history: Mapping[RoleName, tuple[Recommendation, ...]]
    """Keep it for the next round (bounded by the longer window)."""

    def summary(self) -> tuple[str, str]:
        """(reason, message) of the card's Autoscaling condition: the reason the latest
        change's (else the first role's), the message every role's decision."""
        changed = [d for d in self.decisions if d.changed]
        lead = (changed or list(self.decisions))[:1]
        reason = lead[0].reason if lead else "NoRoles"
        return reason, "; ".join(d.said() for d in self.decisions) or "the planner moves no role"


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


def needed(role: RoleName, s: RoleSignals, c: Capacity) -> Pressure | None:
    """The workers the role's offered load needs at the capacity's utilisation, as a `Pressure`
    whose ratio is that count (None: the capacity or the load is unknown for the role). An
    aggregated worker splits its time between the two, so its shares add up. Pure."""
    shares: list[tuple[float, str, str]] = []
    if role != "decode" and c.prefill_tokens_s is not None and s.prompt_tokens_s is not None:
        each, cap = c.prefill_tokens_s * c.utilization, c.prefill_tokens_s
        rate = s.prompt_tokens_s + s.prefill_tokens / c.drain_s
        shares.append((rate / each, "PrefillLoad",
                       f"{s.prompt_tokens_s:,.0f} prompt tokens/s arriving and "
                       f"{s.prefill_tokens:,.0f} waiting (over {c.drain_s:g} s), {each:,.0f}/s "
                       f"per worker ({c.utilization:.0%} of {cap:,.0f})"))  # fmt: skip
    if role != "prefill":
        decode = _decode_share(s, c)
        if decode is not None:
            shares.append(decode)
    if not shares:
        return None
    workers = sum(w for w, _, _ in shares)
    _, reason, _ = max(shares)
    message = "; ".join(m for _, _, m in shares)
    return Pressure(workers, reason, f"{math.ceil(workers - 1e-9)} worker(s) needed: {message}")


def _decode_share(s: RoleSignals, c: Capacity) -> tuple[float, str, str] | None:
    """Decode's workers: the larger of what the tokens generated per second and the sequences in
    flight need (the rate is the load while the workers keep up, the sequences once they queue)."""
    parts: list[tuple[float, str]] = []
    if c.decode_tokens_s is not None and s.generated_tokens_s is not None:
        each = c.decode_tokens_s * c.utilization
        parts.append((s.generated_tokens_s / each,
                      f"{s.generated_tokens_s:,.0f} tokens/s generated, {each:,.0f}/s per worker "
                      f"({c.utilization:.0%} of {c.decode_tokens_s:,.0f})"))  # fmt: skip
    if c.decode_sequences is not None:
        each = c.decode_sequences * c.utilization
        parts.append((s.sequences / each,
                      f"{s.sequences:g} sequences in flight, {each:g} per worker "
                      f"({c.utilization:.0%} of {c.decode_sequences:g})"))  # fmt: skip
    if not parts:
        return None
    workers, _ = max(parts)
    return workers, "DecodeLoad", "; ".join(m for _, m in parts)


def up_to_need(need: Pressure) -> int:
    """The workers a `needed` pressure asks for."""
    return math.ceil(need.ratio - 1e-9)


def _by_pressure(s: RoleSignals, p: Pressure) -> tuple[int, str]:
    """The proportional recommendation: within the tolerance, no change; above, the serving
    workers × the pressure, at most double; below, at most one fewer."""
    current = s.replicas
    wanted = math.ceil(max(s.ready, 1) * p.ratio - 1e-9)
    if abs(p.ratio - 1.0) <= TOLERANCE:
        return current, "AtTarget"
    if p.ratio > 1.0:
        return min(max(wanted, current), 2 * current), p.reason
    return max(wanted, current - 1), "Idle" if p.ratio == 0 else "BelowTarget"


def _by_load(s: RoleSignals, p: Pressure, need: Pressure) -> tuple[int, str, str]:
    """With the load known: the workers it needs (down to it at once, the down window being the
    brake; growth is bounded when it is decided), unless the latency or queue pressure — the
    safety net, for a capacity that was profiled too high — asks for more."""
    current = s.replicas
    n = up_to_need(need)  # the step bound applies to the decision, not to the history
    if p.ratio > 1.0 + TOLERANCE:
        safety, reason = _by_pressure(s, p)
        if safety > n:
            return safety, reason, f"{p.message} (the load alone: {need.message})"
    return n, need.reason if n != current else "AtTarget", need.message


def recommend(
    s: RoleSignals, bounds: RoleBounds, p: Pressure, need: Pressure | None = None
) -> tuple[int, str, str]:
    """This round's replicas for one role before the windows: what the offered load needs
    (`need`, when known) or, beside it or without it, proportional to the pressure (over the
    workers that serve: starting ones count once they do), within the bounds."""
    current = s.replicas
    if current == 0:
        if s.held > 0 or s.waiting > 0:
            n = max(1, bounds.min)
            return n, "ScaleFromZero", f"{max(s.held, int(s.waiting))} request(s) wait for a worker"
        return bounds.min, "Idle", "no worker and nothing waiting"
    if need is not None:
        n, reason, message = _by_load(s, p, need)
    else:
        (n, reason), message = _by_pressure(s, p), p.message
    if n > bounds.max:
        return bounds.max, "AtMax", f"{message}; at the card's max of {bounds.max}"
    if n < bounds.min:
        return bounds.min, "AtMin", f"{message}; at the card's min of {bounds.min}"
    return n, reason, message


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
    need = needed(s.role, s, policy.capacity)
    rec, reason, message = recommend(s, bounds, p, need)
    keep = max(policy.scale_up_s, policy.scale_down_s)
    # a role seen for the first time (a new card, a restarted controller) holds its replicas
    # for the windows, as if they had been recommended just now; a role whose history merely
    # fell out of windows no longer than a round does not
    seen = _window(history, now, keep) if history else (Recommendation(now, s.replicas),)
    recs = (*seen, Recommendation(now, rec))
    current = s.replicas
    up = min(r.replicas for r in _window(recs, now, policy.scale_up_s) or recs[-1:])
    down = max(r.replicas for r in _window(recs, now, policy.scale_down_s) or recs[-1:])
    # growth the offered load needs counts the workers still starting (the need is absolute),
    # so it does not wait for them; growth beyond it (the pressures') does
    covered = need is not None and up_to_need(need) >= up
    if reason == "ScaleFromZero":
        desired = rec  # a held request must not wait out a window
    elif up > current:
        desired = min(up, 2 * current) if current else up
        if desired < up:
            message = f"{message}; at most double in one round"
        if s.unschedulable > 0:
            desired, reason = current, "Unschedulable"
            message = f"{s.unschedulable} pod(s) of {s.role} cannot be scheduled: not growing"
        elif s.ready < current and not covered:
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
