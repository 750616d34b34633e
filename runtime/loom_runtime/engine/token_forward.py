"""The executor of token plans: one model forward for all of a step's chunks, then one sample.

Owns turning a step's TOKEN_FORWARD plans into TokenResults; never schedules, never touches a
block table or a loop state (the batch scheduler advances each loop with its result).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loom_runtime.engine.runner import TOKEN_FORWARD, TokenRunner, TokenWork
from loom_runtime.engine.sampler import SampledToken, sample
from loom_runtime.loop.contract import WorkPlan


@dataclass(frozen=True)
class TokenResult:
    """What one executed plan did: `num_tokens` KV rows written, and the token sampled from the
    last one when the plan reached the end of the sequence."""

    num_tokens: int
    sampled: SampledToken | None = None


class TokenForward:
    """Executor for shape TOKEN_FORWARD: prefill chunks and decode tokens of every loop in one
    varlen forward; the rows that want logits are sampled together, each with its own
    params, generator and history, so a token never depends on who shares the batch."""

    shape = TOKEN_FORWARD

    def __init__(self, runner: TokenRunner) -> None:
        self.runner = runner

    def execute(self, plans: Sequence[WorkPlan[TokenResult]]) -> list[TokenResult]:
        works = [_token_work(p) for p in plans]
        rows = self.runner.execute(works)
        wanted = [(i, row) for i, row in enumerate(rows) if row is not None]
        picked: dict[int, SampledToken] = {}
        if wanted:
            tokens = sample(
                torch.stack([row for _, row in wanted]),
                [works[i].sampling for i, _ in wanted],
                [works[i].generator for i, _ in wanted],
                [works[i].history for i, _ in wanted],
            )
            picked = {i: tok for (i, _), tok in zip(wanted, tokens, strict=True)}
        return [TokenResult(len(w.token_ids), picked.get(i)) for i, w in enumerate(works)]


def _token_work(plan: WorkPlan[TokenResult]) -> TokenWork:
    if plan.shape != TOKEN_FORWARD or not isinstance(plan.work, TokenWork):
        raise TypeError(
            f"plan {plan.kind!r} of request {plan.request_id!r}: shape {plan.shape!r} with a "
            f"{type(plan.work).__name__} payload is not a token_forward plan"
        )
    return plan.work
