"""The executor of token plans under MTP speculation: draft, verify every work in one trunk
forward, sample, keep the MTP rows of what was kept.

Owns the verdict of each speculative decode and the spec-decode counters; never schedules and
never touches a block table (the loop advances by the result's kept rows and tokens).

A verify row j is sampled exactly as a plain decode would sample that position — the same
logit rules over a history that includes the drafts before it, the request's own generator —
and the draft is kept while it equals the sampled token. Since the drafts are argmax picks
(a one-hot draft distribution), this is speculative sampling's accept-with-p(d) rule, and the
generator is drawn once per emitted token as without speculation: seeded and greedy outputs are
token-identical to the plain path, not only equal in distribution.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import overload

import torch

from loom_runtime.engine.runner import TOKEN_FORWARD, TokenWork
from loom_runtime.engine.sampler import SampledToken, TokenHistory, sample
from loom_runtime.engine.spec.mtp_runner import Drafter, SpecRunner
from loom_runtime.engine.token_forward import TokenResult, sample_rows, token_work
from loom_runtime.engine.types import SpecDecodeStats
from loom_runtime.loop.contract import WorkPlan


class SpecForward:
    """Executor for shape TOKEN_FORWARD with MTP: prefill chunks, plain decodes and verifies of
    every loop in one trunk forward. `drafter` stands in for the MTP layer's proposals (tests
    use an oracle to force acceptances); the MTP rows are written by the runner either way."""

    shape = TOKEN_FORWARD

    def __init__(
        self, runner: SpecRunner, num_draft_tokens: int, drafter: Drafter | None = None
    ) -> None:
        self.runner = runner
        self.drafter: Drafter = drafter or runner
        self.stats = SpecDecodeStats(accepted_per_pos=(0,) * num_draft_tokens)

    def execute(self, plans: Sequence[WorkPlan[TokenResult]]) -> list[TokenResult]:
        planned = [token_work(p) for p in plans]
        proposals = self.drafter.propose(planned)
        works = [
            _with_drafts(w, d[: w.draft_tokens]) if w.draft_tokens else w
            for w, d in zip(planned, proposals, strict=True)
        ]
        trunk = self.runner.trunk(works)
        plain = sample_rows(
            works,
            [None if w.draft_tokens else row for w, row in zip(works, trunk.logits, strict=True)],
        )
        results: list[TokenResult] = []
        for i, w in enumerate(works):
            verify_rows = trunk.logits[i]
            if w.draft_tokens and verify_rows is not None:
                drafts = w.token_ids[1:]
                drafted, sampled = verify(w, verify_rows, drafts)
                self.stats = self.stats.add(len(drafts), len(drafted))
                results.append(TokenResult(1 + len(drafted), sampled, drafted))
            else:
                results.append(TokenResult(len(w.token_ids), plain.get(i)))
        self.runner.extend(
            works, trunk, [_next_ids(w, r) for w, r in zip(works, results, strict=True)]
        )
        return results


def verify(
    work: TokenWork, rows: torch.Tensor, drafts: Sequence[int]
) -> tuple[tuple[SampledToken, ...], SampledToken]:
    """The accepted drafts and the token after them: row j ([len(drafts) + 1, vocab]) is
    sampled with the history extended by the drafts before it, and draft j is kept while it
    equals that token (the first one that differs is replaced by it)."""
    accepted: list[SampledToken] = []
    for j in range(len(drafts) + 1):
        history = _with(work.history, [t.token_id for t in accepted])
        tok = sample(rows[j : j + 1], [work.sampling], [work.generator], [history])[0]
        if j < len(drafts) and tok.token_id == drafts[j]:
            accepted.append(tok)
            continue
        return tuple(accepted), tok
    raise AssertionError("unreachable: the last row always ends the verdict")


def _with_drafts(work: TokenWork, drafts: tuple[int, ...]) -> TokenWork:
    """The verify work: its token, then the drafts (none proposed: a plain decode)."""
    return replace(work, token_ids=work.token_ids + drafts, draft_tokens=len(drafts))


def _next_ids(work: TokenWork, result: TokenResult) -> tuple[int, ...]:
    """The tokens after each kept position of the work (what its MTP rows read)."""
    kept = work.token_ids[1 : result.num_tokens]
    if result.sampled is not None:
        return (*kept, result.sampled.token_id)
    if work.next_id is None:
        raise ValueError(f"request {work.request_id!r}: a chunk ended with no next token known")
    return (*kept, work.next_id)


def _with(history: TokenHistory | None, extra: list[int]) -> TokenHistory | None:
    if history is None or not extra:
        return history
    return replace(history, token_ids=_Extended(history.token_ids, tuple(extra)))


class _Extended(Sequence[int]):
    """A history's tokens followed by accepted drafts, without copying the history."""

    def __init__(self, base: Sequence[int], extra: tuple[int, ...]) -> None:
        self.base, self.extra = base, extra

    def __len__(self) -> int:
        return len(self.base) + len(self.extra)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            return [*self.base, *self.extra][i]
        n = len(self.base)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.base[i] if i < n else self.extra[i - n]

    def __iter__(self) -> Iterator[int]:
        yield from self.base
        yield from self.extra
