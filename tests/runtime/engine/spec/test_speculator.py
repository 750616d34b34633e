"""MTP speculative decoding of one sequence (float64 tiny sparse-mla, index_topk 64 < the
300-token prompt): greedy output equals plain greedy decoding for every draft length, with the
MTP drafter and with an oracle drafter that makes long acceptances happen; the MTP rows kept
after the rounds equal one MTP forward over the whole sequence (scratch rows really dropped)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from loom_runtime.engine.spec.speculator import MtpDrafter, MtpSpeculator, SpecOutput
from loom_runtime.models.sparse_mla.hooks import LocalHooks
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla, load_sparse_mla
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK, init_tiny_sparse_mla
from loom_runtime.models.tiny_tokenizer import corpus_text

PROMPT = 300
STEPS = 64
CAPACITY = PROMPT + STEPS + 8


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedSparseMla:
    path = init_tiny_sparse_mla(tmp_path_factory.mktemp("mtp") / "tiny")
    return load_sparse_mla(path, dtype=torch.float64)


@pytest.fixture(scope="module")
def prompt(loaded: LoadedSparseMla) -> list[int]:
    ids = loaded.tokenizer.encode(corpus_text())[:PROMPT]
    assert len(ids) == PROMPT > INDEX_TOPK
    return ids


@pytest.fixture(scope="module")
def plain(loaded: LoadedSparseMla, prompt: list[int]) -> list[int]:
    """Greedy decoding one token per forward: the output speculation must reproduce."""
    model = loaded.model
    cache = model.new_cache(CAPACITY)
    logits = model.forward(torch.tensor(prompt), cache)
    out = [int(torch.argmax(logits[-1]))]
    while len(out) < STEPS:
        out.append(int(torch.argmax(model.forward(torch.tensor(out[-1:]), cache)[-1])))
    return out


@pytest.fixture(scope="module")
def speculated(
    loaded: LoadedSparseMla, prompt: list[int]
) -> dict[int, tuple[MtpDrafter, SpecOutput]]:
    """Greedy MTP speculation with 1 and 3 drafts per step, and the drafter each one used."""
    runs = {}
    for k in (1, 3):
        drafter = MtpDrafter(loaded.model, CAPACITY)
        runs[k] = drafter, MtpSpeculator(loaded.model, k, CAPACITY, drafter).generate(prompt, STEPS)
    return runs


@pytest.mark.parametrize("k", [1, 3])
def test_mtp_speculation_is_token_identical_to_plain_greedy(
    speculated: dict[int, tuple[MtpDrafter, SpecOutput]], plain: list[int], k: int
) -> None:
    _, got = speculated[k]
    assert list(got.token_ids) == plain
    assert got.stats.steps >= (STEPS - 1) // k  # every step emits at most k + 1 tokens


class OracleDrafter:
    """Test double of a well-trained drafter: proposes the known greedy continuation, with every
    `miss`-th proposal wrong, so long acceptances and rejections both happen."""

    def __init__(self, continuation: list[int], prompt_len: int, miss: int) -> None:
        self.continuation = continuation
        self.prompt_len = prompt_len
        self.miss = miss
        self.next_pos = 0
        self.proposals = 0

    def extend(self, normed: torch.Tensor, next_ids: list[int], start: int) -> None:
        self.next_pos = start + len(next_ids) + 1  # the position of the first draft

    def propose(self, k: int) -> list[int]:
        self.proposals += 1
        base = self.next_pos - self.prompt_len
        drafts = [self.continuation[min(base + j, len(self.continuation) - 1)] for j in range(k)]
        if self.proposals % self.miss == 0:
            drafts[-1] = (drafts[-1] + 1) % 100
        return drafts


def test_long_acceptances_stay_identical_and_roll_back_rejected_rows(
    loaded: LoadedSparseMla, prompt: list[int], plain: list[int]
) -> None:
    drafter = OracleDrafter(plain, len(prompt), miss=3)
    got = MtpSpeculator(loaded.model, 3, CAPACITY, drafter).generate(prompt, STEPS)
    assert list(got.token_ids) == plain
    assert max(got.stats.accepted) == 3 and min(got.stats.accepted) < 3
    assert got.stats.mean_acceptance_length > 2.5
    per_pos = got.stats.accepted_per_position()
    assert per_pos[0] >= per_pos[1] >= per_pos[2] > 0


def test_the_drafters_kept_rows_equal_one_mtp_forward_over_the_sequence(
    loaded: LoadedSparseMla,
    prompt: list[int],
    plain: list[int],
    speculated: dict[int, tuple[MtpDrafter, SpecOutput]],
) -> None:
    model: SparseMlaForCausalLM = loaded.model
    drafter, _ = speculated[3]
    seq = prompt + plain
    committed = drafter.cache.length
    assert len(prompt) <= committed < len(seq)
    cache = model.new_cache(CAPACITY)
    ids = torch.tensor(seq[:committed])
    positions = torch.arange(committed)
    normed = model.normed(model.hidden_states(ids, positions, LocalHooks(cache)))
    mtp = model.new_mtp_cache(CAPACITY)
    model.mtp[0].forward(normed, torch.tensor(seq[1 : committed + 1]), positions, LocalHooks(mtp))
    # the drafter's rows came from forwards of 1-4 tokens, these from one over the sequence:
    # the MoE router's float32 GEMM may round a row differently inside a bigger batch (~1e-7
    # in the states, CPU-dependent; see tests/runtime/parallel/sparse_mla/test_parity.py), while
    # a scratch row left behind would differ by O(1)
    torch.testing.assert_close(
        drafter.cache.latent[:, :committed], mtp.latent[:, :committed], rtol=0, atol=1e-6
    )
    torch.testing.assert_close(
        drafter.cache.index_keys[:, :committed], mtp.index_keys[:, :committed], rtol=0, atol=1e-6
    )


def test_a_checkpoint_without_mtp_layers_and_a_bad_draft_count_are_refused(
    loaded: LoadedSparseMla,
) -> None:
    with pytest.raises(ValueError, match="numDraftTokens must be at least 1"):
        MtpSpeculator(loaded.model, 0, CAPACITY)
    bare = SparseMlaForCausalLM(replace(loaded.config, num_nextn_predict_layers=0))
    with pytest.raises(ValueError, match="no MTP layer"):
        MtpDrafter(bare, CAPACITY)


def test_sampled_speculation_is_reproducible_from_its_seed(
    loaded: LoadedSparseMla, prompt: list[int]
) -> None:
    def sampled(seed: int) -> tuple[int, ...]:
        spec = MtpSpeculator(loaded.model, 3, CAPACITY)
        gen = torch.Generator().manual_seed(seed)
        return spec.generate(prompt[:96], 16, temperature=0.8, gen=gen).token_ids

    first = sampled(0)
    assert len(first) == 16 and all(0 <= t < loaded.config.vocab_size for t in first)
    assert sampled(0) == first
    with pytest.raises(ValueError, match="needs a generator"):
        MtpSpeculator(loaded.model, 3, CAPACITY).generate(prompt, 4, temperature=0.8)
