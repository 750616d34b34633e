"""Several sequences decoded in one forward on real gloo ranks (decode_batch) each equal one
rank decoding that sequence alone: token-identical greedy output and float64 logits within
1e-6 at every step, over DCP2 (interleave 1 and 4, ag_rs and a2a), PCP2×DCP2, EP2 and one
rank. The prompts differ in length, so the sequences' contexts (and their DCP shards) differ;
one is shorter than the index top-k (64) and the others longer, so the batch's selections
have different widths and the indexer's choice decides what each one attends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from tests.runtime.parallel.sparse_mla.test_parity import prompt_of

from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.parallel.collectives import Comm
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.parallel.sparse_mla.generate import BatchTrace
from loom_runtime.parallel.sparse_mla.plan import DcpBackend, RankPlan
from loom_runtime.parallel.sparse_mla.sequence import (
    ParallelSequence,
    decode_batch,
    forward_batch,
)

# The MoE router's float32 matmul over n rows may round a row differently from the same row
# alone (see test_parity.py's PCP): 1e-6, with the greedy tokens identical.
TOLERANCE = 1e-6
LENGTHS = (301, 5, 640, 97)
STEPS = 12


@pytest.mark.parametrize(
    ("layout", "backend", "pcp_split"),
    [
        (ParallelLayout(pcp=2, dcp=2, interleave=1), "ag_rs", False),
        (ParallelLayout(pcp=2, dcp=2, interleave=4), "a2a", False),
        (ParallelLayout(pcp=2, dcp=2, interleave=4), "ag_rs", True),
        (ParallelLayout(pcp=2, ep=2), "ag_rs", True),
        (ParallelLayout(), "ag_rs", True),
    ],
    ids=["dcp2-i1-ag_rs", "dcp2-i4-a2a", "pcp2-dcp2-i4", "pcp2-ep2", "one-rank"],
)
def test_a_batched_decode_equals_each_sequence_alone_on_one_rank(
    ours: LoadedSparseMla,
    on_ranks: Callable[..., list[BatchTrace]],
    one_rank: Callable[..., Any],
    layout: ParallelLayout,
    backend: DcpBackend,
    pcp_split: bool,
) -> None:
    vocab = ours.config.vocab_size
    prompts = tuple(prompt_of(n, 40 + i, vocab) for i, n in enumerate(LENGTHS))
    assert min(LENGTHS) < ours.config.index_topk < max(LENGTHS)
    traces = on_ranks(layout, prompts, STEPS, backend, pcp_split, batch=True)
    for trace in traces:
        for i, prompt in enumerate(prompts):
            expected = one_rank(prompt, STEPS)
            assert trace.tokens[i] == expected.tokens
            assert (trace.step_logits[i] - expected.step_logits).abs().max().item() < TOLERANCE
    held = sum(n + STEPS for n in LENGTHS)
    if layout.dcp == 2:  # the two DCP ranks of a copy hold every row once between them
        assert traces[0].kv_tokens + traces[1].kv_tokens == held
    else:
        assert all(t.kv_tokens == held for t in traces)


def test_decode_batch_refuses_a_batch_it_cannot_run(ours: LoadedSparseMla) -> None:
    model = ours.model
    plan = RankPlan.single()
    seqs = [ParallelSequence(model, plan, 32) for _ in range(2)]
    for seq in seqs:
        seq.prefill(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="at least one"):
        decode_batch([], torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="2 sequences for 1 chunks"):
        decode_batch(seqs, torch.tensor([4]))
    with pytest.raises(ValueError, match="twice"):
        decode_batch([seqs[0], seqs[0]], torch.tensor([4, 5]))
    other = ParallelSequence(model, RankPlan.single(), 32)
    other.prefill(torch.tensor([1]))
    with pytest.raises(ValueError, match="one model and plan"):
        decode_batch([seqs[0], other], torch.tensor([4, 5]))
    assert [s.length for s in seqs] == [3, 3]  # nothing was run


def test_prompt_chunks_and_decodes_in_one_forward_equal_each_run_alone(
    ours: LoadedSparseMla,
) -> None:
    """Without PCP and DCP a step's prompt chunks join its decodes' forward (a DP replica's
    whole step): a first chunk, a later chunk over earlier rows, a one-token prompt and a
    decode, each equal to running it alone (float64; top-k 64 below the 130-token context)."""
    model, plan = ours.model, RankPlan.single()
    vocab = ours.config.vocab_size
    alone = [ParallelSequence(model, plan, 400) for _ in range(4)]
    together = [ParallelSequence(model, plan, 400) for _ in range(4)]
    for a, b in zip(alone[2:], together[2:], strict=True):  # two with earlier rows
        first = torch.tensor(prompt_of(60, 70, vocab))
        a.prefill(first)
        b.prefill(first)
    chunks = [torch.tensor(prompt_of(n, 71 + n, vocab)) for n in (130, 1, 70, 1)]
    solo = torch.cat([seq.prefill(c)[-1:] for seq, c in zip(alone, chunks, strict=True)])
    batch = forward_batch(together, chunks)
    assert (solo - batch).abs().max().item() < TOLERANCE
    assert solo.argmax(dim=-1).tolist() == batch.argmax(dim=-1).tolist()
    ids = batch.argmax(dim=-1)
    step = torch.cat([seq.decode(ids[i : i + 1]) for i, seq in enumerate(alone)])
    assert (step - decode_batch(together, ids)).abs().max().item() < TOLERANCE
    assert [s.length for s in together] == [131, 2, 131, 62]


def test_chunks_of_several_tokens_do_not_batch_under_pcp_or_dcp(ours: LoadedSparseMla) -> None:
    single = RankPlan.single()
    pcp = replace(single, pcp=Comm(ranks=(0, 1), index=0))  # refused before any collective
    seqs = [ParallelSequence(ours.model, single, 32) for _ in range(2)]
    for seq in seqs:
        seq.plan = pcp
    with pytest.raises(ValueError, match="only without PCP and DCP"):
        forward_batch(seqs, [torch.tensor([1, 2]), torch.tensor([3])])
