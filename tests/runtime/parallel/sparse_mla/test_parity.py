"""PCP2, DCP2 (interleave 1 and 4, ag_rs and a2a), PCP2×DCP2, EP2 and their mixes on real gloo
ranks each equal one rank: token-identical greedy output, and float64 logits within 1e-9 (DCP,
EP) or 1e-6 (with a PCP split: see EXACT, PCP) at every prompt position and decode step, with
index top-k (64) far below the context so the indexer's (global) choice decides what is
attended. One long case per mode (2,048-token prompt, 64 decode steps), shorter variants."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.parallel.sparse_mla.generate import GenerateTrace

# float64 logits. DCP and EP only regroup float64 sums: 1e-9. A PCP rank runs the MoE router's
# float32 matmul over its own share of the rows, and a float32 GEMM may round a row at a tile
# edge differently from the same row inside a bigger batch (1 ulp of a routing weight, ~1e-7 in
# the logits: one rank's chunked prefill differs from its whole prefill the same way, see
# test_model.py): 1e-6, with the greedy tokens still identical.
EXACT, PCP = 1e-9, 1e-6
LONG, STEPS = 2048, 64
SHORT, FEW = 300, 12
Runs = Callable[..., list[GenerateTrace]]
Ref = Callable[..., Any]


def prompt_of(length: int, seed: int, vocab: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(vocab, (length,), generator=gen).tolist())


def assert_same_run(trace: GenerateTrace, expected: Any, tolerance: float) -> None:
    """Token-identical greedy output, logits within `tolerance` at every prompt and decode step."""
    assert trace.tokens == expected.tokens
    assert trace.prompt_logits.shape == expected.prompt_logits.shape
    assert (trace.prompt_logits - expected.prompt_logits).abs().max().item() < tolerance
    assert (trace.step_logits - expected.step_logits).abs().max().item() < tolerance


def test_pcp2_prefill_and_decode_equal_one_rank(
    ours: LoadedSparseMla, on_ranks: Runs, one_rank: Ref
) -> None:
    prompt = prompt_of(LONG, 1, ours.config.vocab_size)
    assert ours.config.index_topk < LONG
    traces = on_ranks(ParallelLayout(pcp=2), (prompt,), STEPS)
    for trace in traces:
        assert_same_run(trace, one_rank(prompt, STEPS), PCP)
        assert trace.kv_tokens == LONG + STEPS  # PCP alone: every rank holds every row


@pytest.mark.parametrize(
    ("interleave", "backend", "length", "steps"),
    [
        (1, "ag_rs", LONG, STEPS),
        (4, "a2a", LONG, STEPS),
        (1, "a2a", SHORT, FEW),
        (4, "ag_rs", SHORT, FEW),
    ],
)
def test_dcp2_decode_equals_one_rank(
    ours: LoadedSparseMla,
    on_ranks: Runs,
    one_rank: Ref,
    interleave: int,
    backend: str,
    length: int,
    steps: int,
) -> None:
    """DCP alone: every rank prefills the whole prompt but keeps only its shard; each decode
    step attends over the shards and merges."""
    prompt = prompt_of(length, 2, ours.config.vocab_size)
    layout = ParallelLayout(pcp=2, dcp=2, interleave=interleave)
    traces = on_ranks(layout, (prompt,), steps, dcp_backend=backend, pcp_split=False)
    for trace in traces:
        assert_same_run(trace, one_rank(prompt, steps), EXACT)
    assert sum(t.kv_tokens for t in traces) == length + steps


@pytest.mark.parametrize(("interleave", "length", "steps"), [(4, LONG, STEPS), (1, 301, FEW)])
def test_pcp2_x_dcp2_equals_one_rank(
    ours: LoadedSparseMla, on_ranks: Runs, one_rank: Ref, interleave: int, length: int, steps: int
) -> None:
    """The reference prefill shape on 2 ranks: the prompt split by DualChunkSwap, its rows
    all-gathered per layer and kept DCP-sharded, then DCP decode."""
    prompt = prompt_of(length, 3, ours.config.vocab_size)
    layout = ParallelLayout(pcp=2, dcp=2, interleave=interleave)
    for trace in on_ranks(layout, (prompt,), steps):
        assert_same_run(trace, one_rank(prompt, steps), PCP)


def test_ep2_equals_one_rank_for_each_dp_rank(
    ours: LoadedSparseMla, on_ranks: Runs, one_rank: Ref
) -> None:
    """The reference decode shape on 2 ranks: DP2 with EP2, each rank its own request, the
    routed experts split between them and tokens dispatched both ways."""
    prompts = (
        prompt_of(LONG, 4, ours.config.vocab_size),
        prompt_of(1100, 5, ours.config.vocab_size),
    )
    traces = on_ranks(ParallelLayout(dp=2, ep=2), prompts, STEPS)
    for trace, prompt in zip(traces, prompts, strict=True):
        assert_same_run(trace, one_rank(prompt, STEPS), EXACT)
    full = sum(
        t.numel() * t.element_size()
        for layer in ours.model.layers
        for name, t in layer.ffn.targets().items()
        if name.startswith("experts.")
    )
    assert [t.expert_bytes for t in traces] == [full // 2, full // 2]


def test_pcp2_x_dcp2_x_ep2_equals_one_rank(
    ours: LoadedSparseMla, on_ranks: Runs, one_rank: Ref
) -> None:
    prompt = prompt_of(SHORT, 6, ours.config.vocab_size)
    layout = ParallelLayout(pcp=2, dcp=2, ep=2, interleave=4)
    for trace in on_ranks(layout, (prompt,), FEW, dcp_backend="a2a"):
        assert_same_run(trace, one_rank(prompt, FEW), PCP)


def test_four_ranks_pcp4_with_two_dcp2_groups_and_ep4_equal_one_rank(
    ours: LoadedSparseMla, on_ranks: Runs, one_rank: Ref
) -> None:
    """PCP over all four ranks, the KV sharded within each of two DCP pairs (each pair a whole
    copy), experts over all four: groups of different kinds really differ."""
    prompt = prompt_of(SHORT, 7, ours.config.vocab_size)
    layout = ParallelLayout(pcp=4, dcp=2, ep=4, interleave=4)
    traces = on_ranks(layout, (prompt,), FEW)
    for trace in traces:
        assert_same_run(trace, one_rank(prompt, FEW), PCP)
    assert traces[0].kv_tokens == traces[2].kv_tokens  # ranks 0 and 2 hold the same shard
    assert traces[0].kv_tokens + traces[1].kv_tokens == SHORT + FEW


@pytest.mark.parametrize("layout", [ParallelLayout(pcp=2), ParallelLayout(pcp=2, dcp=2)])
def test_chunked_pcp_prefill_equals_one_rank_chunked_alike(
    ours: LoadedSparseMla, on_ranks: Runs, one_rank: Ref, layout: ParallelLayout
) -> None:
    """Later chunks attend over earlier ones: with DCP those rows are gathered from the
    shards into a temporary full copy per layer."""
    prompt = prompt_of(SHORT, 8, ours.config.vocab_size)
    for trace in on_ranks(layout, (prompt,), FEW, prefill_chunk=128):
        assert_same_run(trace, one_rank(prompt, FEW, 128), PCP)
