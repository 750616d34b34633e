"""A HiSparse rank's tiers (TieredStore, TieredHooks) on a group of one: a sequence whose rows
live in the host tier, with its keys on the device and a hot buffer of selected rows, gives the
plain rank sequence's logits bit for bit (index top-k 64 below the 300-token prompt, a hot
buffer of one slot more than top-k, so decodes miss and hit), chunked prefill, decodes, a
batch of sequences, fp8 KV and a truncated draft alike; the tier counters count real copies."""

from __future__ import annotations

import pytest
import torch

from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.kv.hisparse_cache import TierCounters
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK
from loom_runtime.parallel.sparse_mla.plan import RankPlan
from loom_runtime.parallel.sparse_mla.sequence import ParallelSequence, decode_batch
from loom_runtime.parallel.sparse_mla.tiered_store import TieredStore

PROMPT, STEPS, CHUNK = 300, 24, 128
HOT = INDEX_TOPK + 1
CAPACITY = PROMPT + STEPS + 8
PLAN = RankPlan.single()  # one plan for every sequence: a batch's sequences share theirs


def prompt_of(length: int, seed: int, vocab: int) -> torch.Tensor:
    return torch.randint(vocab, (length,), generator=torch.Generator().manual_seed(seed))


def sequences(
    ours: LoadedSparseMla, fp8: Fp8Format | None = None, counters: TierCounters | None = None
) -> tuple[ParallelSequence, ParallelSequence]:
    """A plain rank sequence and one over HiSparse tiers."""
    plain = ParallelSequence(ours.model, PLAN, CAPACITY, kv_fp8=fp8)
    tiered = ParallelSequence(
        ours.model, PLAN, CAPACITY, kv_fp8=fp8, hot_slots=HOT, counters=counters
    )
    assert isinstance(tiered.store, TieredStore) and not isinstance(plain.store, TieredStore)
    return plain, tiered


def prefill(seq: ParallelSequence, prompt: torch.Tensor) -> torch.Tensor:
    parts = [
        seq.prefill(prompt[at : at + CHUNK], all_logits=True) for at in range(0, len(prompt), CHUNK)
    ]
    return torch.cat(parts)


@pytest.mark.parametrize("fp8", [None, Fp8Format()], ids=["exact", "fp8"])
def test_a_sequence_over_the_tiers_equals_the_plain_one(
    ours: LoadedSparseMla, fp8: Fp8Format | None
) -> None:
    counters = TierCounters()
    plain, tiered = sequences(ours, fp8, counters)
    prompt = prompt_of(PROMPT, 1, ours.config.vocab_size)
    assert torch.equal(prefill(tiered, prompt), prefill(plain, prompt))
    assert counters.prefill_h2d_bytes > 0 and counters.hits == counters.misses == 0
    token = torch.tensor([7])
    for _ in range(STEPS):
        logits = plain.decode(token)
        assert torch.equal(tiered.decode(token), logits)
        token = logits[-1:].argmax(-1)
    assert counters.hits > 0 and counters.misses > 0 and counters.resident > 0
    store = tiered.store
    assert isinstance(store, TieredStore)
    assert counters.h2d_bytes == counters.misses * store.cache.row_bytes
    # the device holds the keys (in whole blocks) and the hot rows; the host every row
    blocks = -(-store.kv_tokens // 16)
    assert store.device_bytes(16) == blocks * 16 * store.keys.bytes_per_token + store.hot.nbytes
    assert store.keys.bytes_per_token < store.bytes_per_token
    assert store.block_bytes(16) == plain.store.block_bytes(16)


def test_a_batch_of_sequences_over_the_tiers_equals_the_plain_batch(
    ours: LoadedSparseMla,
) -> None:
    """Three sequences (one below top-k) decoded as one forward: over the tiers, each query
    reads its own sequence's selected rows, as the plain batch does."""
    pairs = [sequences(ours) for _ in range(3)]
    for i, (plain, tiered) in enumerate(pairs):
        prompt = prompt_of(40 + 130 * i, 10 + i, ours.config.vocab_size)
        assert torch.equal(tiered.prefill(prompt), plain.prefill(prompt))
    tokens = torch.tensor([3, 5, 8])
    for _ in range(6):
        together = decode_batch([p for p, _ in pairs], tokens)
        assert torch.equal(decode_batch([t for _, t in pairs], tokens), together)
        tokens = together.argmax(-1)


def test_a_truncated_draft_leaves_no_stale_hot_row(ours: LoadedSparseMla) -> None:
    """Decodes at p and p + 1 put their rows in the hot buffer; the sequence is cut back to p
    (a verify's rejected drafts) and p, p + 1 rewritten with other tokens by a two-token
    forward (which bypasses the hot buffer): later decodes must read the new rows."""
    plain, tiered = sequences(ours)
    short = INDEX_TOPK // 2  # below top-k: every earlier row is selected at every step
    prompt = prompt_of(short, 2, ours.config.vocab_size)
    plain.prefill(prompt)
    tiered.prefill(prompt)
    for seq in (plain, tiered):
        seq.decode(torch.tensor([11]))
        seq.decode(torch.tensor([12]))
        seq.store.truncate(short)
        seq.decode(torch.tensor([13, 10]))
    for token in (14, 15, 16):
        assert torch.equal(
            tiered.decode(torch.tensor([token])), plain.decode(torch.tensor([token]))
        )


def test_a_seeded_prefix_lands_in_both_tiers(ours: LoadedSparseMla) -> None:
    """A sequence started from another's rows (a prefix hit, a P/D pull) decodes alike."""
    plain, _ = sequences(ours)
    prompt = prompt_of(PROMPT, 3, ours.config.vocab_size)
    plain.prefill(prompt)
    held = plain.store.rows_between(0, PROMPT)
    counters = TierCounters()
    _, seeded = sequences(ours, counters=counters)
    seeded.store.seed(held)
    assert counters.keys_h2d_bytes > 0
    for token in (4, 6, 9):
        assert torch.equal(
            seeded.decode(torch.tensor([token])), plain.decode(torch.tensor([token]))
        )
