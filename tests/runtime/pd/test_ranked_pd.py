"""P/D from a prefill's ranks: a prefill whose forwards run on PCP/DCP gloo rank processes
exports each step's new rows into its own paged latent pool, and a one-rank decode pulls them
over TCP and NIXL (different block sizes) and continues with the one-rank greedy tokens,
prompts past the indexer's top-k included, fp8 KV too; each DCP rank sends only its own
tokens, so the pool holds every token once. And P/D into ranks: a ranked decode's pool takes
the pull, and its ranks are seeded from it, MTP rows included, and draft from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.runtime.engine.sparse_mla_helpers import RecordingDrafter, one_sequence
from tests.runtime.pd.engine_workers import Workers, run, wait_for, whole
from tests.runtime.pd.test_sparse_mla_pd import prefilled, prompt

from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.causal_lm import SparseMlaCausalLM
from loom_runtime.parallel.layout import ParallelLayout

MAX_TOKENS = 6
LENGTHS = (9, 150, 300)


@pytest.mark.parametrize(
    ("layout", "kind"),
    [
        (ParallelLayout(pcp=2, dcp=2, interleave=1), "tcp"),
        (ParallelLayout(pcp=2, dcp=2, interleave=4, ep=2), "nixl"),
        (ParallelLayout(pcp=2), "tcp"),
    ],
    ids=["pcp2-dcp2-i1-tcp", "pcp2-dcp2-i4-ep2-nixl", "pcp2-tcp"],
)
def test_a_ranked_prefill_feeds_a_one_rank_decode_with_the_one_rank_tokens(
    workers: Workers, sparse_checkpoint: Path, sparse64: LoadedModel, layout: ParallelLayout,
    kind: str,
) -> None:  # fmt: skip
    prefill = workers.ranked_engine(sparse_checkpoint, layout, block_size=32, kind=kind)
    decode, _ = workers.engine("decode", block_size=16, kind=kind)
    assert isinstance(sparse64.model, SparseMlaCausalLM)
    per_token = decode.stats().kv_bytes_per_token
    assert prefill.stats().kv_cache_bytes == (2048 // 32) * 32 * per_token  # a real pool
    pulled = 0
    for i, n in enumerate(LENGTHS):
        tokens = prompt(n, seed=30 + i)
        expected = one_sequence(sparse64.model.model, tokens, MAX_TOKENS)
        params = prefilled(prefill, f"p{i}", tokens)
        out = run(decode, f"d{i}", tokens, MAX_TOKENS, params).result()
        assert out.output_token_ids == expected, f"prompt of {n} tokens from {layout.describe()}"
        pulled += (n - 1) * per_token
        assert decode.stats().kv_pulled_bytes == pulled
        wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")
        wait_for(lambda: whole(decode), "the decode's pool to be whole")
    ranks = prefill.stats().ranks
    assert len(ranks) == layout.world and all(r.sequences == 0 for r in ranks)


@pytest.mark.parametrize(
    "layout",
    [ParallelLayout(pcp=2, dcp=2), ParallelLayout(pcp=2, ep=2), ParallelLayout(dp=2, ep=2)],
    ids=["dcp2", "ep2", "dp2-ep2"],
)
def test_a_decode_on_ranks_is_seeded_from_its_pulled_pool_with_the_one_rank_tokens(
    workers: Workers, sparse_checkpoint: Path, sparse64: LoadedModel, layout: ParallelLayout
) -> None:
    """P/D into ranks: a one-rank prefill's KV is pulled into the ranked decode's own pool, the
    ranks' new sequence is seeded from it (each DCP rank its own tokens), and the decode steps
    run on the ranks (DCP-sharded attention, or EP): one rank's tokens."""
    prefill, _ = workers.engine("prefill", block_size=32)
    decode = workers.ranked_engine(sparse_checkpoint, layout, role="decode", block_size=16)
    assert isinstance(sparse64.model, SparseMlaCausalLM)
    for i, n in enumerate(LENGTHS):
        tokens = prompt(n, seed=60 + i)
        expected = one_sequence(sparse64.model.model, tokens, MAX_TOKENS)
        params = prefilled(prefill, f"p{i}", tokens)
        out = run(decode, f"d{i}", tokens, MAX_TOKENS, params).result()
        assert out.output_token_ids == expected, f"prompt of {n} tokens into {layout.describe()}"
        wait_for(lambda: whole(decode), "the decode's pool to be whole")
    assert decode.stats().kv_pulled_tokens == sum(n - 1 for n in LENGTHS)


def test_fp8_rows_from_ranks_equal_the_one_rank_fp8_engines(
    workers: Workers, sparse_checkpoint: Path
) -> None:
    """PCP2×DCP2 ranks round their rows through fp8 as a one-rank fp8 pool keeps them; the pool
    re-packs them to the same bytes, and the decode continues with the one-rank fp8 tokens."""
    fp8 = Fp8Format(16)
    aggregated, _ = workers.engine(kv_fp8=fp8)
    layout = ParallelLayout(pcp=2, dcp=2)
    prefill = workers.ranked_engine(sparse_checkpoint, layout, block_size=32, kv_fp8=fp8)
    decode, _ = workers.engine("decode", block_size=16, kv_fp8=fp8)
    for i, n in enumerate(LENGTHS):
        tokens = prompt(n, seed=40 + i)
        expected = run(aggregated, f"a{i}", tokens, MAX_TOKENS).result().output_token_ids
        params = prefilled(prefill, f"p{i}", tokens)
        out = run(decode, f"d{i}", tokens, MAX_TOKENS, params).result()
        assert out.output_token_ids == expected, f"prompt of {n} tokens"
        wait_for(lambda: whole(decode), "the decode's pool to be whole")


@pytest.mark.parametrize(
    "decode_layout", [None, ParallelLayout(dp=2, ep=2)], ids=["one-rank", "dp2-ep2"]
)
def test_mtp_rows_from_ranks_let_the_decode_draft_as_the_aggregated_engine(
    workers: Workers,
    sparse_checkpoint: Path,
    sparse64: LoadedModel,
    decode_layout: ParallelLayout | None,
) -> None:
    """PCP2×DCP2 ranks compute the prompt's MTP rows beside the trunk's (PCP-gathered,
    DCP-sharded) and export them; the MTP decode (one rank, or DP2×EP2 ranks seeded with the
    rows and drafting on them: the reference's shape) gives one rank's tokens, and every draft
    it proposes equals the aggregated MTP engine's at the same position."""
    spies = RecordingDrafter(), RecordingDrafter()
    aggregated, _ = workers.engine(mtp_draft_tokens=3, drafter=spies[0])
    layout = ParallelLayout(pcp=2, dcp=2)
    prefill = workers.ranked_engine(sparse_checkpoint, layout, block_size=32, mtp_draft_tokens=3)
    if decode_layout is None:
        decode, _ = workers.engine("decode", block_size=16, mtp_draft_tokens=3, drafter=spies[1])
    else:
        decode = workers.ranked_engine(
            sparse_checkpoint, decode_layout, "decode", mtp_draft_tokens=3, drafter=spies[1]
        )
    spies[0].watch(aggregated)
    spies[1].watch(decode)
    assert isinstance(sparse64.model, SparseMlaCausalLM)
    for i, n in enumerate(LENGTHS):
        tokens = prompt(n, seed=50 + i)
        expected = one_sequence(sparse64.model.model, tokens, MAX_TOKENS)
        assert run(aggregated, f"a{i}", tokens, MAX_TOKENS).result().output_token_ids == expected
        params = prefilled(prefill, f"p{i}", tokens)
        out = run(decode, f"d{i}", tokens, MAX_TOKENS, params).result()
        assert out.output_token_ids == expected, f"prompt of {n} tokens"
        assert spies[1].seen[f"d{i}"] == spies[0].seen[f"a{i}"]
        wait_for(lambda: whole(decode), "the decode's pool to be whole")
