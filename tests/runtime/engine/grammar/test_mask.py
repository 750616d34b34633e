"""The batched grammar mask: a constrained row keeps exactly the ids its matcher allows, rows
without a grammar are bit-identical to the plain sampler's, and the bitmask unpacks bit by bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import xgrammar as xgr

from loom_runtime.engine.grammar.compiler import GrammarCompiler
from loom_runtime.engine.grammar.mask import apply_grammar_masks, unpack_bitmask
from loom_runtime.engine.grammar.matcher import GrammarState
from loom_runtime.engine.sampler import SampledToken, sample
from loom_runtime.engine.types import SamplingParams
from loom_runtime.wire.openai.structured import GrammarSpec
from loom_runtime.wire.tokenizer import Tokenizer

VOCAB = 4160  # wider than the tiny tokenizer's vocabulary, as a padded model's logits are


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, VOCAB)


def _allowed_by_matcher(state: GrammarState) -> set[int]:
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    state.fill(bitmask, 0)
    return {i for i in range(VOCAB) if (int(bitmask[0, i // 32]) >> (i % 32)) & 1}


def test_unpack_reads_every_bit_of_every_word() -> None:
    words = torch.tensor([[1 - (1 << 31), 0], [0, 1 << 3]], dtype=torch.int32)  # bit 31: sign
    got = unpack_bitmask(words, 40)
    assert got.shape == (2, 40)
    assert got[0].nonzero().flatten().tolist() == [0, 31]
    assert got[1].nonzero().flatten().tolist() == [35]


def test_a_constrained_row_keeps_exactly_the_allowed_ids_and_others_are_untouched(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    choice = GrammarState(compiler.compile(GrammarSpec("choice", '["yes", "no"]', "c")))
    digits = GrammarState(compiler.compile(GrammarSpec("regex", "[0-9]{3}", "r")))
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    apply_grammar_masks(logits, [None, choice, None, digits])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    for row, state in ((1, choice), (3, digits)):
        kept = set(torch.isfinite(logits[row]).nonzero().flatten().tolist())
        assert kept == _allowed_by_matcher(state)
        assert torch.equal(logits[row][list(kept)], before[row][list(kept)])
    eos = tokenizer.eos_token_ids[0]
    assert eos not in _allowed_by_matcher(choice)  # the grammar cannot end yet
    assert all(tokenizer.decode([t]) in {"y", "ye", "yes", "n", "no"}
               or "yes".startswith(tokenizer.decode([t]))
               or "no".startswith(tokenizer.decode([t]))
               for t in _allowed_by_matcher(choice))  # fmt: skip


def test_unconstrained_rows_sample_bit_identically_to_the_plain_sampler(
    compiler: GrammarCompiler,
) -> None:
    logits = torch.randn(3, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=1.0, seed=7, logprobs=3)] * 3
    state = GrammarState(compiler.compile(GrammarSpec("regex", "[a-z]+", "r")))

    def run(masked: bool) -> list[SampledToken]:
        x = logits.clone()
        if masked:
            apply_grammar_masks(x, [None, state, None])
        gens = [torch.Generator().manual_seed(7) for _ in range(3)]
        return sample(x, params, list(gens))

    plain, mixed = run(False), run(True)
    assert mixed[0] == plain[0] and mixed[2] == plain[2]
    assert mixed[1].token_id in _allowed_by_matcher(state)


def test_eos_is_allowed_only_where_the_grammar_may_end(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    eos = tokenizer.eos_token_ids[0]
    state = GrammarState(compiler.compile(GrammarSpec("choice", '["yes"]', "c")))
    for token in tokenizer.encode("yes", add_special_tokens=False):
        assert eos not in _allowed_by_matcher(state)
        state.accept(token)
    assert _allowed_by_matcher(state) == {eos}
    state.accept(eos)
    assert state.terminated


def test_a_token_outside_the_mask_is_an_error(compiler: GrammarCompiler) -> None:
    state = GrammarState(compiler.compile(GrammarSpec("regex", "[0-9]", "r")))
    allowed = _allowed_by_matcher(state)
    outside = next(t for t in range(VOCAB) if t not in allowed)
    with pytest.raises(ValueError, match="outside its grammar"):
        state.accept(outside)
