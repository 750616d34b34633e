"""The multi-turn agentic trace the routing and long-context benches replay (llm-d's shape).

Pure and seeded: builds token ids, arrival and think times; never runs a request or reads a file.

Groups of users share a long system prompt; each user runs a session whose context grows every
turn (system prompt + every earlier user message and answer + the new message); sessions start
as a Poisson process and think between turns.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceShape:
    groups: int  # groups of users sharing one system prompt
    users: int  # users (sessions) per group
    turns: int  # turns per session
    system_tokens: int  # tokens of each group's system prompt
    user_tokens: int  # tokens of each user message
    rate: float  # new sessions per second (Poisson)
    think_s: float  # mean think time between turns (exponential)
    seed: int = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TraceShape:
        """The shape from a bench's parsed flags of the same names."""
        return cls(
            args.groups, args.users, args.turns, args.system_tokens, args.user_tokens,
            args.rate, args.think_s, args.seed,
        )  # fmt: skip


@dataclass(frozen=True)
class Session:
    group: int
    user: int
    start_s: float
    messages: tuple[tuple[int, ...], ...]
    thinks: tuple[float, ...]


def _ids(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(10, 4000) for _ in range(n))


def workload(shape: TraceShape) -> tuple[list[tuple[int, ...]], list[Session]]:
    """Each group's system prompt, and the sessions in order of their start."""
    rng = random.Random(shape.seed)
    systems = [_ids(rng, shape.system_tokens) for _ in range(shape.groups)]
    sessions = []
    at = 0.0
    order = [(g, u) for g in range(shape.groups) for u in range(shape.users)]
    rng.shuffle(order)
    for group, user in order:
        at += rng.expovariate(shape.rate)
        messages = tuple(_ids(rng, shape.user_tokens) for _ in range(shape.turns))
        thinks = tuple(rng.expovariate(1 / shape.think_s) for _ in range(shape.turns))
        sessions.append(Session(group, user, at, messages, thinks))
    return systems, sessions


def turn_order(sessions: list[Session]) -> list[tuple[int, int]]:
    """(session index, turn) in the order the turns arrive when a turn takes no time: turn k of
    a session at its start plus its first k think times. What a one-at-a-time replay follows."""
    timed = [
        (s.start_s + sum(s.thinks[:turn]), index, turn)
        for index, s in enumerate(sessions)
        for turn in range(len(s.messages))
    ]
    return [(index, turn) for _, index, turn in sorted(timed)]
