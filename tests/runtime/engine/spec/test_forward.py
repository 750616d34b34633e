"""The verdict of one speculative decode (engine/spec_forward.verify): each verify row is
sampled as a plain decode would sample that position, with the accepted drafts in the history
its logit rules read (repetition penalty, min_tokens), and the generator drawn once per
emitted token; the spec-decode counters add up as vLLM's."""

from __future__ import annotations

import torch

from loom_runtime.engine.runner import TokenWork
from loom_runtime.engine.sampler import TokenHistory, make_generator, sample
from loom_runtime.engine.spec.forward import verify
from loom_runtime.engine.types import SamplingParams, SpecDecodeStats
from loom_runtime.kv.block_table import BlockTable

VOCAB = 16


def work(params: SamplingParams, history: list[int], gen: torch.Generator | None) -> TokenWork:
    return TokenWork(
        request_id="r",
        token_ids=(history[-1],),
        start=len(history) - 1,
        table=BlockTable(),
        want_logits=True,
        sampling=params,
        generator=gen,
        history=TokenHistory(history, 2, frozenset({0})),
        draft_tokens=2,
    )


def rows(*peaks: dict[int, float]) -> torch.Tensor:
    out = torch.zeros(len(peaks), VOCAB, dtype=torch.float64)
    for i, peak in enumerate(peaks):
        for token, value in peak.items():
            out[i, token] = value
    return out


def test_greedy_keeps_drafts_while_they_are_the_argmax_and_replaces_the_first_miss() -> None:
    w = work(SamplingParams(temperature=0.0), [1, 2, 3], None)
    drafted, sampled = verify(w, rows({5: 2.0}, {9: 2.0}, {4: 2.0}), (5, 7))
    assert [t.token_id for t in drafted] == [5] and sampled.token_id == 9
    drafted, sampled = verify(w, rows({5: 2.0}, {7: 2.0}, {4: 2.0}), (5, 7))
    assert [t.token_id for t in drafted] == [5, 7] and sampled.token_id == 4  # the bonus row
    drafted, sampled = verify(w, rows({6: 2.0}, {7: 2.0}, {4: 2.0}), (5, 7))
    assert drafted == () and sampled.token_id == 6


def test_a_row_reads_the_drafts_accepted_before_it_as_history() -> None:
    """Row 1 prefers token 5 (2.0) over 7 (1.5); draft 5 was accepted at row 0, so the
    repetition penalty of 2 halves it to 1.0 and row 1 picks 7, as a plain decode would."""
    w = work(SamplingParams(temperature=0.0, repetition_penalty=2.0), [1, 2, 3], None)
    drafted, sampled = verify(w, rows({5: 2.0}, {5: 2.0, 7: 1.5}, {4: 2.0}), (5, 7))
    assert [t.token_id for t in drafted] == [5, 7] and sampled.token_id == 4


def test_min_tokens_counts_the_accepted_drafts() -> None:
    """Stop id 0 is masked while fewer than min_tokens (2) outputs exist: one output so far
    (history [1, 2 | 3]), so row 0 may not stop, row 1 (after an accepted draft) may."""
    w = work(SamplingParams(temperature=0.0, min_tokens=2), [1, 2, 3], None)
    drafted, sampled = verify(w, rows({0: 3.0, 5: 2.0}, {0: 3.0, 7: 2.0}, {4: 2.0}), (5, 7))
    assert [t.token_id for t in drafted] == [5] and sampled.token_id == 0


def test_a_seeded_verdict_draws_the_generator_once_per_emitted_token() -> None:
    """The tokens equal sampling the rows one by one with the same seed (no speculation), and
    the generator ends where that would leave it."""
    params = SamplingParams(temperature=1.0, seed=3)
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    plain_gen = make_generator(3)
    plain = [sample(logits[j : j + 1], [params], [plain_gen], [None])[0].token_id for j in (0, 1)]
    gen = make_generator(3)
    w = TokenWork("r", (1,), 0, BlockTable(), True, params, gen, None, draft_tokens=2)
    drafted, sampled = verify(w, logits, (plain[0], (plain[1] + 1) % VOCAB))
    assert [t.token_id for t in drafted] == [plain[0]] and sampled.token_id == plain[1]
    assert torch.equal(gen.get_state(), plain_gen.get_state())


def test_spec_counters_add_drafts_acceptances_and_positions() -> None:
    stats = SpecDecodeStats(accepted_per_pos=(0, 0, 0)).add(3, 2).add(3, 0).add(2, 1)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 3)
    assert stats.accepted_per_pos == (2, 1, 0)
    assert stats.mean_acceptance_length == 2.0
