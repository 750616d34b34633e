"""How one OpenAI request's choices map onto engine requests: `n` (and `best_of`) samples of
each prompt, each its own engine request, as vLLM fans a request out.

Owns the numbering (a choice's `index` is prompt * n + rank, as vLLM and OpenAI number them),
the engine request ids, each sample's seed and which samples are kept under best_of; never
builds an engine request and never reads a body beyond the counts it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loom_runtime.wire.openai.fields import SEED_MIN

MAX_N = 128
"""Choices per prompt (OpenAI's ceiling for n); best_of has the same ceiling."""
MAX_SAMPLES = 256
"""Engine requests one HTTP request may start: prompts x samples."""


@dataclass(frozen=True)
class Choices:
    """`samples` engine requests per prompt (best_of, else n), `n` of them returned."""

    num_prompts: int
    n: int = 1
    samples: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.n <= self.samples:
            raise ValueError(f"n={self.n} needs 1 <= n <= samples={self.samples}")

    @property
    def total(self) -> int:
        return self.num_prompts * self.samples

    @property
    def ranked(self) -> bool:
        """Whether some samples are dropped (best_of > n): the rest ranked by log-probability."""
        return self.samples > self.n

    def engine_id(self, request_id: str, k: int) -> str:
        """Sample k's engine request id: the request's own when it is the only one, else
        `request_id-k` (a list of prompts has always been numbered so)."""
        return request_id if self.total == 1 else f"{request_id}-{k}"

    def prompt_of(self, k: int) -> int:
        return k // self.samples

    def leader_of(self, k: int) -> int | None:
        """The sample whose prefill sample k reuses (the first of its prompt), None for it."""
        first = k - k % self.samples
        return None if k == first else first

    @staticmethod
    def seed(seed: int | None, k_in_prompt: int) -> int | None:
        """A sample's own seed: the request's plus its position among its prompt's samples
        (vLLM's rule), so a seeded request is reproducible and its samples differ; it wraps
        within the seed's range."""
        if seed is None:
            return None
        return (seed + k_in_prompt - SEED_MIN) % 2**64 + SEED_MIN

    def kept(self, scores: Sequence[float]) -> list[int]:
        """The samples returned, in choice order: per prompt the `n` with the highest score
        (cumulative log-probability; ties keep sample order); every sample when none is
        dropped."""
        if len(scores) != self.total:
            raise ValueError(f"{len(scores)} scores for {self.total} samples")
        if not self.ranked:
            return list(range(self.total))
        out: list[int] = []
        for p in range(self.num_prompts):
            mine = range(p * self.samples, (p + 1) * self.samples)
            out += sorted(mine, key=lambda k: -scores[k])[: self.n]
        return out
