"""The executor of token plans: one model forward for all of a step's chunks, then one sample.

Owns turning a step's TOKEN_FORWARD plans into TokenResults; never schedules, never touches a
block table or a loop state (the batcher advances each loop with its result).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loom_runtime.engine.grammar.mask import apply_grammar_masks
from loom_runtime.engine.prompt_logprobs import chunk_prompt_logprobs
from loom_runtime.engine.runner import TOKEN_FORWARD, TokenRunner, TokenWork
from loom_runtime.engine.sampler import SampledToken, sample
from loom_runtime.loop.contract import WorkPlan
from loom_runtime.wire.openai.logprobs import TokenLogprob


@dataclass(frozen=True)
class TokenResult:
    """What one executed plan did: `num_tokens` KV rows written (and kept), and the token
    sampled from the last one when the plan reached the end of the sequence. A speculative
    decode also emits the drafts it accepted (`drafted`, before `sampled`): their rows are
    among the `num_tokens`."""

    num_tokens: int
    sampled: SampledToken | None = None
    drafted: tuple[SampledToken, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # positions start + 1 .. of its work

    @property
    def num_emitted(self) -> int:
        """Tokens this result adds to its sequence."""
        return len(self.drafted) + (self.sampled is not None)


class TokenForward:
    """Executor for shape TOKEN_FORWARD: prefill chunks and decode tokens of every loop in one
    varlen forward; the rows that want logits are sampled together, each with its own
    params, generator and history, so a token never depends on who shares the batch."""

    shape = TOKEN_FORWARD

    def __init__(self, runner: TokenRunner) -> None:
        self.runner = runner

    def execute(self, plans: Sequence[WorkPlan[TokenResult]]) -> list[TokenResult]:
        works = [token_work(p) for p in plans]
        logits = self.runner.execute(works)
        picked = sample_rows(works, [_sample_row(w, r) for w, r in zip(works, logits, strict=True)])
        return [
            TokenResult(len(w.token_ids), picked.get(i), (), _prompt_lp(w, logits[i]))
            for i, w in enumerate(works)
        ]


def _sample_row(work: TokenWork, rows: torch.Tensor | None) -> torch.Tensor | None:
    """The row to sample from: with prompt log-probs the last of the chunk's rows, if wanted."""
    if work.prompt_logprobs is None or rows is None:
        return rows
    return rows[-1] if work.want_logits else None


def _prompt_lp(work: TokenWork, rows: torch.Tensor | None) -> tuple[TokenLogprob, ...]:
    if work.prompt_logprobs is None or rows is None:
        return ()
    return chunk_prompt_logprobs(work, rows)


def sample_rows(
    works: Sequence[TokenWork], rows: Sequence[torch.Tensor | None]
) -> dict[int, SampledToken]:
    """One token for each work with a logits row (by work index), all in one sample call; the
    rows of works with a grammar are masked first (one bitmask for them, the others untouched)."""
    wanted = [(i, row) for i, row in enumerate(rows) if row is not None]
    if not wanted:
        return {}
    logits = torch.stack([row for _, row in wanted])
    apply_grammar_masks(logits, [works[i].grammar for i, _ in wanted])
    tokens = sample(
        logits,
        [works[i].sampling for i, _ in wanted],
        [works[i].generator for i, _ in wanted],
        [works[i].history for i, _ in wanted],
    )
    return {i: tok for (i, _), tok in zip(wanted, tokens, strict=True)}


def token_work(plan: WorkPlan[TokenResult]) -> TokenWork:
    if plan.shape != TOKEN_FORWARD or not isinstance(plan.work, TokenWork):
        raise TypeError(
            f"plan {plan.kind!r} of request {plan.request_id!r}: shape {plan.shape!r} with a "
            f"{type(plan.work).__name__} payload is not a token_forward plan"
        )
    return plan.work
