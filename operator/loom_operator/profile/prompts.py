"""The prompts a profile sends: token ids cycled from a pool the worker's own tokenizer made,
each led by the request's number in that pool's digits, so no two share a cached prefix.

Pure; never sends anything.
"""

from __future__ import annotations

from collections.abc import Sequence

POOL_TEXT = (
    "Loom serves language models on Kubernetes: a router spreads requests over workers, each "
    "worker batches prefill and decode steps, and a planner sizes every role from its load. "
)
"""Text whose token ids fill every prompt (any ids the tokenizer produces are valid ones)."""

LEAD_DIGITS = 4
"""Digits of a request's number at the head of its prompt: unique for pool**4 requests."""


def token_pool(ids: Sequence[int]) -> tuple[int, ...]:
    """The distinct ids of the pool text, in first-seen order; at least two are needed to
    spell request numbers."""
    pool = tuple(dict.fromkeys(ids))
    if len(pool) < 2:
        raise ValueError(f"the tokenizer made {len(pool)} distinct ids of the pool text; need 2")
    return pool


def prompt_ids(pool: Sequence[int], number: int, length: int) -> list[int]:
    """`length` ids: request `number` written in base len(pool) (LEAD_DIGITS digits), then the
    pool repeated. Two numbers below len(pool)**LEAD_DIGITS never share their first ids."""
    base = len(pool)
    lead = [pool[(number // base**i) % base] for i in range(LEAD_DIGITS)]
    body = [pool[i % base] for i in range(max(0, length - LEAD_DIGITS))]
    return (lead + body)[:length]
