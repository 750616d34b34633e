"""A keep swap (push mode keep): weights swapped in under running requests, which go on. Every
token carries the version that sampled it; kv="recompute" re-prefills under the new weights
(exactly a fresh run of prompt + output so far), kv="keep" goes on over the old KV; the prefix
cache never serves KV of the old weights after the swap. Float64, greedy, steps driven here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from tests.runtime.engine.push_helpers import stage

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.keep_swap import check_keep
from loom_runtime.engine.runner import TokenWork
from loom_runtime.engine.spec.mtp_runner import Drafter
from loom_runtime.engine.types import EngineRequest, RequestOutput, SamplingParams
from loom_runtime.errors import InvalidRequestError
from loom_runtime.models.loader import load_model
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.models.tiny import init_tiny
from loom_runtime.transfer.weight_push import StagedPush

Prompt = Callable[[int, int], tuple[int, ...]]
Greedy = Callable[..., SamplingParams]

MAX_TOKENS = 24
BEFORE = 6  # steps before the swap: the prompt's step and five decodes, one token each


def config(**kw: object) -> EngineConfig:
    base: dict[str, object] = {"dtype": torch.float64, "max_model_len": 256, "num_blocks": 64}
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("keep")
    return init_tiny(root / "old", seed=0), init_tiny(root / "new", seed=1)


def fresh_engine(path: Path, **kw: object) -> Engine:
    return Engine(load_model(path, dtype=torch.float64), config(**kw))


def pushed(new_dir: Path, tmp_path: Path, name: str = "v2") -> StagedPush:
    model = load_model(new_dir, dtype=torch.float64).model
    tensors: dict[str, torch.Tensor] = model.targets()  # type: ignore[attr-defined]
    return stage(tensors, name, tmp_path / f"staged-{name}")


def version_runs(outs: list[RequestOutput]) -> list[tuple[str, int]]:
    """(version, tokens) per run of consecutive outputs of one version."""
    runs: list[tuple[str, int]] = []
    for o in outs:
        if not o.new_token_ids:
            continue
        if runs and runs[-1][0] == o.weights_version:
            runs[-1] = (o.weights_version, runs[-1][1] + len(o.new_token_ids))
        else:
            runs.append((o.weights_version, len(o.new_token_ids)))
    return runs


def tokens_of(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def run_across_a_swap(
    engine: Engine, staged: StagedPush, p: tuple[int, ...], greedy: Greedy, kv: str
) -> list[RequestOutput]:
    outs: list[RequestOutput] = []
    engine.add_request(EngineRequest("a", p, greedy(MAX_TOKENS)), outs.append)
    for _ in range(BEFORE):
        engine.step()
    engine.load_pushed_keep(staged, kv)
    while engine.in_flight():
        engine.step()
    return outs


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_request_across_a_keep_swap_carries_each_tokens_version(
    dirs: tuple[Path, Path], tmp_path: Path, prompt: Prompt, greedy: Greedy, kv: str
) -> None:
    old_dir, new_dir = dirs
    p = prompt(40, 3)
    old_run = fresh_engine(old_dir).generate(p, greedy(MAX_TOKENS)).output_token_ids
    engine = fresh_engine(old_dir)
    outs = run_across_a_swap(engine, pushed(new_dir, tmp_path), p, greedy, kv)
    final = outs[-1]
    assert final.finished and final.finish_reason == "length"
    assert version_runs(outs) == [("v1", BEFORE), ("v2", MAX_TOKENS - BEFORE)]
    got = tokens_of(outs)
    assert len(got) == MAX_TOKENS and got[:BEFORE] == list(old_run[:BEFORE])
    assert engine.weights_version == "v2" and engine.stats().num_requests_aborted == 0
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_blocks  # nothing of it stays cached


def test_recompute_continues_as_a_fresh_run_of_the_new_weights(
    dirs: tuple[Path, Path], tmp_path: Path, prompt: Prompt, greedy: Greedy
) -> None:
    old_dir, new_dir = dirs
    p = prompt(40, 4)
    outs = run_across_a_swap(
        fresh_engine(old_dir), pushed(new_dir, tmp_path), p, greedy, "recompute"
    )
    got = tokens_of(outs)
    reference = fresh_engine(new_dir).generate((*p, *got[:BEFORE]), greedy(MAX_TOKENS - BEFORE))
    assert got[BEFORE:] == list(reference.output_token_ids)
    assert outs[-1].metrics is not None and outs[-1].metrics.num_preemptions == 1


def test_keep_goes_on_over_the_old_kv(
    dirs: tuple[Path, Path], tmp_path: Path, prompt: Prompt, greedy: Greedy
) -> None:
    """Its post-swap tokens come from the new weights over the old KV: not the recompute's."""
    old_dir, new_dir = dirs
    p = prompt(40, 4)
    kept = tokens_of(
        run_across_a_swap(fresh_engine(old_dir), pushed(new_dir, tmp_path), p, greedy, "keep")
    )
    again = pushed(new_dir, tmp_path, "v2b")
    redone = tokens_of(run_across_a_swap(fresh_engine(old_dir), again, p, greedy, "recompute"))
    assert kept[:BEFORE] == redone[:BEFORE]
    assert kept != redone  # the old KV changed what the new weights drew


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_no_request_after_the_swap_hits_a_prefix_cached_block_of_the_old_weights(
    dirs: tuple[Path, Path], tmp_path: Path, prompt: Prompt, greedy: Greedy, kv: str
) -> None:
    old_dir, new_dir = dirs
    p = prompt(40, 5)
    engine = fresh_engine(old_dir)
    engine.generate(p, greedy(8))  # its prompt blocks are cached under v1
    running: list[RequestOutput] = []
    engine.add_request(EngineRequest("a", p, greedy(MAX_TOKENS)), running.append)
    for _ in range(BEFORE):
        engine.step()
    engine.load_pushed_keep(pushed(new_dir, tmp_path), kv)
    after = engine.generate(p, greedy(8), request_id="after")
    assert after.num_cached_tokens == 0 and after.weights_version == "v2"
    while engine.in_flight():
        engine.step()
    # a prompt of the running request's whole sequence: only blocks computed under v2 may hit
    seq = (*p, *tokens_of(running))
    late = engine.generate(seq, greedy(8), request_id="late")
    new = fresh_engine(new_dir)
    assert after.output_token_ids == new.generate(p, greedy(8)).output_token_ids
    assert late.output_token_ids == new.generate(seq, greedy(8)).output_token_ids
    # hits: `after`'s prompt blocks (v2); with recompute, also the running request's (re-prefilled
    # under v2); with keep, none of its blocks (their KV attends to v1's)
    assert late.num_cached_tokens == (32 if kv == "keep" else 48)
    assert running[-1].num_cached_tokens == 32  # the cache was warm under v1 before the swap


def test_a_request_queued_during_the_swap_runs_on_the_new_version(
    dirs: tuple[Path, Path], tmp_path: Path, prompt: Prompt, greedy: Greedy
) -> None:
    old_dir, new_dir = dirs
    engine = fresh_engine(old_dir)
    outs: list[RequestOutput] = []
    engine.add_request(EngineRequest("q", prompt(20, 6), greedy(4)), outs.append)  # not stepped
    engine.load_pushed_keep(pushed(new_dir, tmp_path), "keep")
    while engine.in_flight():
        engine.step()
    assert version_runs(outs) == [("v2", 4)]


def test_a_keep_swap_refuses_a_bad_kv_option_and_the_serving_version(
    dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    old_dir, new_dir = dirs
    engine = fresh_engine(old_dir)
    with pytest.raises(InvalidRequestError, match="kv must be one of keep, recompute"):
        engine.load_pushed_keep(pushed(new_dir, tmp_path), "drop")
    with pytest.raises(InvalidRequestError, match="already serving weights version 'v1'"):
        engine.load_pushed_keep(pushed(new_dir, tmp_path, "v1"), "keep")
    assert engine.weights_version == "v1"
    assert check_keep("recompute", "v2", "v1") == "recompute"


class TruthDrafter:
    """Test double for the MTP layer's proposals (the tiny model's random MTP head drafts
    almost nothing a verify accepts): before output token `spoil_below` it proposes a wrong
    first draft, so each step makes one token; from there the true continuation, all
    accepted when the engine computes what the plain run did."""

    def __init__(self, truth: Sequence[int], num_prompt: int, spoil_below: int, vocab: int) -> None:
        self.truth, self.num_prompt = tuple(truth), num_prompt
        self.spoil_below, self.vocab = spoil_below, vocab

    def propose(self, works: Sequence[TokenWork]) -> list[tuple[int, ...]]:
        out = []
        for w in works:
            drafts = list(self.truth[w.start + 1 : w.start + 1 + w.draft_tokens])
            if drafts and w.start + 1 - self.num_prompt < self.spoil_below:
                drafts[0] = (drafts[0] + 1) % self.vocab
            out.append(tuple(drafts))
        return out


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_keep_swap_under_mtp_speculation_gives_the_tokens_without_it(
    sparse_dir: Path, tmp_path: Path, prompt: Prompt, greedy: Greedy, kv: str
) -> None:
    """A keep swap after BEFORE tokens with MTP off, then with MTP on (3 drafts per step, the
    drafts after the swap accepted): greedy speculation is lossless, so the tokens and each
    token's version agree, in fewer steps, for both KV policies."""
    v2 = init_tiny_sparse_mla(tmp_path / "v2", seed=1)
    p = prompt(40, 5)

    def run(mtp: int, drafter: Drafter | None) -> tuple[list[RequestOutput], int]:
        """The request's outputs across the swap, and the steps it took."""
        model = load_model(sparse_dir, dtype=torch.float64)
        engine = Engine(model, config(mtp_draft_tokens=mtp, num_blocks=80), drafter=drafter)
        targets = load_model(v2, dtype=torch.float64).model.targets()  # type: ignore[attr-defined]
        staged = stage(targets, "v2", tmp_path / f"staged-mtp{mtp}")
        outs: list[RequestOutput] = []
        engine.add_request(EngineRequest("a", p, greedy(MAX_TOKENS)), outs.append)
        steps = 0
        while len(tokens_of(outs)) < BEFORE:
            steps += engine.step()
        engine.load_pushed_keep(staged, kv)
        while engine.in_flight():
            steps += engine.step()
        return outs, steps

    plain, plain_steps = run(0, None)
    vocab = load_model(sparse_dir, dtype=torch.float64).config.vocab_size
    truth = TruthDrafter((*p, *tokens_of(plain)), len(p), BEFORE, vocab)
    speculated, mtp_steps = run(3, truth)
    assert tokens_of(speculated) == tokens_of(plain) and len(tokens_of(plain)) == MAX_TOKENS
    assert version_runs(speculated) == version_runs(plain) == [
        ("v1", BEFORE), ("v2", MAX_TOKENS - BEFORE)
    ]  # fmt: skip
    assert mtp_steps < plain_steps  # drafts were accepted after the swap: speculation ran
