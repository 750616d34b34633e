"""Several sequences decoded in one forward on real gloo ranks (decode_batch) each equal one
rank decoding that sequence alone: token-identical greedy output and float64 logits within
1e-6 at every step, over DCP2 (interleave 1 and 4, ag_rs and a2a), PCP2×DCP2, EP2 and one
rank. The prompts differ in length, so the sequences' contexts (and their DCP shards) differ;
one is shorter than the index top-k (64) and the others longer, so the batch's selections
have different widths and the indexer's choice decides what each one attends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tests.runtime.parallel.sparse_mla.test_parity import prompt_of

from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.parallel.sparse_mla.generate import BatchTrace
from loom_runtime.parallel.sparse_mla.plan import DcpBackend, RankPlan
from loom_runtime.parallel.sparse_mla.sequence import ParallelSequence, decode_batch

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
    with pytest.raises(ValueError, match="2 sequences for 1 tokens"):
        decode_batch(seqs, torch.tensor([4]))
    with pytest.raises(ValueError, match="twice"):
        decode_batch([seqs[0], seqs[0]], torch.tensor([4, 5]))
    other = ParallelSequence(model, RankPlan.single(), 32)
    other.prefill(torch.tensor([1]))
    with pytest.raises(ValueError, match="one model and plan"):
        decode_batch([seqs[0], other], torch.tensor([4, 5]))
    assert [s.length for s in seqs] == [3, 3]  # nothing was run
