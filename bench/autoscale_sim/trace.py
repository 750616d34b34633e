"""The bursty trace the autoscaling bench replays: bench/agentic_trace.py's sessions (a shared
system prompt, a context that grows every turn, think times) started at a rate that changes
from phase to phase, each turn with a seeded output length.

Pure and seeded; never simulates serving.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from bench.agentic_trace import TraceShape, workload


@dataclass(frozen=True)
class Request:
    """One turn as the fleet sees it: when it arrives, its prompt and how many tokens it gets."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Phase:
    seconds: float
    sessions_per_s: float


@dataclass(frozen=True)
class BurstyTrace:
    phases: tuple[Phase, ...]
    groups: int = 8
    turns: int = 4
    system_tokens: int = 1024
    user_tokens: int = 64
    think_s: float = 10.0
    """Mean time between a turn and the next (an agent's tool call and the user)."""
    output_tokens: tuple[int, int] = (32, 512)
    """Each turn's output length, uniform in this range."""
    seed: int = 0

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)


DEFAULT_PHASES = (
    Phase(300, 0.9), Phase(120, 5.4), Phase(360, 0.9), Phase(180, 2.7),
    Phase(240, 0.6), Phase(120, 7.2), Phase(300, 0.9), Phase(180, 3.6),
    Phase(300, 0.6),
)  # fmt: skip
"""A 35-minute trace: a quiet base of 0.6-0.9 sessions/s (4 turns each) and four bursts of
3-12x it, two to three minutes long."""


def requests(trace: BurstyTrace, intensity: float = 1.0) -> list[Request]:
    """Every turn of every session in arrival order; `intensity` scales each phase's rate."""
    out: list[tuple[float, int, int]] = []
    rng = random.Random(trace.seed)
    offset = 0.0
    for index, phase in enumerate(trace.phases):
        rate = phase.sessions_per_s * intensity
        users = max(1, math.ceil(rate * phase.seconds / trace.groups))
        shape = TraceShape(
            trace.groups, users, trace.turns, trace.system_tokens, trace.user_tokens,
            rate, trace.think_s, trace.seed * 1000 + index,
        )  # fmt: skip
        _, sessions = workload(shape)
        for s in sessions:
            if s.start_s >= phase.seconds:
                break
            context = trace.system_tokens
            at = offset + s.start_s
            for turn in range(trace.turns):
                out_tokens = rng.randint(*trace.output_tokens)
                context += trace.user_tokens
                out.append((at, context, out_tokens))
                context += out_tokens
                at += s.thinks[turn]
        offset += phase.seconds
    out.sort()
    return [Request(i, at, p, o) for i, (at, p, o) in enumerate(out)]
