"""Rollouts through the fleet's OpenAI API: a group of seeded completions per prompt, each with
the token ids it sampled, the log-prob the fleet reports for each, and the weights version that
sampled it.

Owns talking to the OpenAI endpoint; never judges a rollout (the trainer checks versions and
computes rewards) and never retries: a failed request is a failed rollout, recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from openai import OpenAI

REQUEST_TIMEOUT_S = 120.0
VERSION_HEADER = "x-loom-weights-version"


@dataclass(frozen=True)
class Rollout:
    """One sampled completion as the fleet answered it."""

    prompt: int
    """Index of its prompt."""
    seed: int
    prompt_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()
    """The sampled tokens (return_token_ids): exact, never a re-tokenization of the text."""
    logprobs: tuple[float, ...] = ()
    """The fleet's log-prob of each sampled token (temperature 1, no masking: the sampling
    distribution is the model's own)."""
    version: str = ""
    """The x-loom-weights-version header."""
    fingerprint: str = ""
    """The response's system_fingerprint (Loom sets it to the weights version too)."""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class Sampling:
    """How every rollout is sampled: plain temperature-1 sampling, a fixed length."""

    model: str
    max_tokens: int


def seed_of(base: int, step: int, prompt: int, member: int) -> int:
    """A distinct seed per (step, prompt, group member): a group is a request per member, so
    each rollout records the seed that reproduces it."""
    return ((base * 1_000 + step) * 1_000 + prompt) * 1_000 + member


def sample_one(client: OpenAI, how: Sampling, prompt: str, index: int, seed: int) -> Rollout:
    """One seeded completion; an error is recorded in the rollout, never raised."""
    try:
        raw = client.completions.with_raw_response.create(
            model=how.model, prompt=prompt, max_tokens=how.max_tokens, temperature=1.0,
            top_p=1.0, seed=seed, logprobs=0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )  # fmt: skip
        body = raw.parse()
        choice = body.choices[0]
        extra: dict[str, Any] = choice.model_extra or {}
        logprobs = choice.logprobs.token_logprobs if choice.logprobs is not None else None
        return Rollout(
            index, seed, tuple(extra["prompt_token_ids"]), tuple(extra["token_ids"]),
            tuple(float(x) for x in logprobs or ()), raw.headers.get(VERSION_HEADER, ""),
            body.system_fingerprint or "",
        )  # fmt: skip
    except Exception as exc:  # the point is to count failed rollouts, whatever they are
        return Rollout(index, seed, error=f"{type(exc).__name__}: {exc}")


def sample_groups(
    endpoint: str,
    how: Sampling,
    prompts: Sequence[str],
    group: int,
    seed: int,
    step: int,
    concurrency: int,
) -> list[Rollout]:
    """`group` rollouts of every prompt, `concurrency` requests in flight; ordered by prompt,
    then group member."""
    jobs = [(p, m) for p in range(len(prompts)) for m in range(group)]
    client = OpenAI(base_url=endpoint, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(
                lambda j: sample_one(client, how, prompts[j[0]], j[0], seed_of(seed, step, *j)),
                jobs,
            ))  # fmt: skip
    finally:
        client.close()
