"""MTP speculation in the engine's batched step (float64 tiny sparse-mla, index_topk 64 < the
contexts): concurrent chunked requests with MTP on give exactly the tokens of MTP off, greedy
and seeded-sampled alike (repetition penalty, min_tokens, stop ids and max_tokens inside a
verify included), with the model's own MTP drafts and with an oracle drafter that forces
acceptances of every length; preemption and prefix hits keep it so (a hit gives up its last
block); and the drafts the engine's paged MTP rows propose are the one-sequence drafter's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch
from tests.runtime.engine.conftest import random_prompt
from tests.runtime.engine.sparse_mla_helpers import (
    Prompt,
    RecordingDrafter,
    greedy,
    inner,
    run_all,
)

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.runner import TokenWork
from loom_runtime.engine.spec.mtp_runner import Drafter
from loom_runtime.engine.spec.speculator import MtpDrafter, MtpSpeculator
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK

K = 3
LENGTHS = [5, 40, 70, 130, 260]  # > INDEX_TOPK from 70 on; > 96 (one chunk) from 130 on


def config(mtp: int, **overrides: int) -> EngineConfig:
    base = EngineConfig(
        dtype=torch.float64,
        num_blocks=80,
        max_model_len=512,
        max_num_batched_tokens=96,
        max_num_seqs=8,
        mtp_draft_tokens=mtp,
    )
    return replace(base, **overrides)


def sampled(n: int, seed: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=n, temperature=0.9, top_p=0.9, seed=seed, repetition_penalty=1.1,
        min_tokens=3, ignore_eos=True,
    )  # fmt: skip


def requests(
    prompt: Prompt, n: int = 24, lengths: Sequence[int] = LENGTHS, seed: int = 300
) -> list[EngineRequest]:
    """Concurrent requests of these prompt lengths, n tokens each: greedy and seeded-sampled
    by turns."""
    out = []
    for i, length in enumerate(lengths):
        params = greedy(n) if i % 2 == 0 else sampled(n, seed=seed - 260 + i)
        out.append(EngineRequest(f"r{i}", prompt(length, seed + i), params))
    return out


def full_tokens(reqs: Sequence[EngineRequest], outputs: dict[str, tuple[int, ...]]) -> dict:
    return {r.request_id: (*r.prompt_token_ids, *outputs[r.request_id]) for r in reqs}


class OracleDrafter:
    """Test double for the MTP layer's proposals: it knows each request's true continuation
    (from the MTP-off run) and proposes it, spoiling one draft at a position that moves with
    the step, so verifies accept 0..k drafts. The MTP rows are still written by the runner."""

    def __init__(self, truth: dict[str, tuple[int, ...]], vocab: int) -> None:
        self.truth, self.vocab = truth, vocab
        self.proposed = 0

    def propose(self, works: Sequence[TokenWork]) -> list[tuple[int, ...]]:
        out = []
        for w in works:
            true = self.truth[w.request_id][w.start + 1 : w.start + 1 + w.draft_tokens]
            drafts = list(true)
            spoil = (w.start * 7 + len(w.request_id)) % (K + 1)
            if spoil < len(drafts):
                drafts[spoil] = (drafts[spoil] + 1) % self.vocab
            self.proposed += len(drafts)
            out.append(tuple(drafts))
        return out


def serve(
    loaded: LoadedModel, cfg: EngineConfig, reqs: list[EngineRequest], drafter: Drafter | None
) -> tuple[Engine, dict[str, tuple[int, ...]]]:
    engine = Engine(loaded, cfg, drafter=drafter)
    got = run_all(engine, reqs)
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_blocks
    return engine, got


@pytest.fixture(scope="module")
def plain_run(sparse64: LoadedModel) -> dict[str, tuple[int, ...]]:
    return serve(sparse64, config(0), requests(random_prompt), None)[1]


def test_mtp_drafts_give_the_tokens_of_mtp_off(
    sparse64: LoadedModel, prompt: Prompt, plain_run: dict[str, tuple[int, ...]]
) -> None:
    engine, got = serve(sparse64, config(K), requests(prompt), None)
    assert got == plain_run
    spec = engine.stats().spec
    assert spec is not None and spec.num_drafts > 0 and spec.num_draft_tokens >= spec.num_drafts


def test_forced_acceptances_of_every_length_keep_the_tokens(
    sparse64: LoadedModel, prompt: Prompt, plain_run: dict[str, tuple[int, ...]]
) -> None:
    reqs = requests(prompt)
    oracle = OracleDrafter(full_tokens(reqs, plain_run), sparse64.config.vocab_size)
    engine, got = serve(sparse64, config(K), reqs, oracle)
    assert got == plain_run
    spec = engine.stats().spec
    assert spec is not None
    assert all(n > 0 for n in spec.accepted_per_pos)  # every draft position was accepted
    assert spec.num_accepted_tokens > spec.num_drafts  # more than one token per verify
    assert spec.num_draft_tokens == oracle.proposed
    # tokens emitted = prefills' first tokens + per verify its accepted drafts and one more
    assert engine.stats().num_generation_tokens == sum(len(v) for v in got.values())
    assert (
        engine.stats().num_tokens_computed
        < sum(len(r.prompt_token_ids) for r in reqs)
        + sum(len(v) for v in got.values())
        + spec.num_draft_tokens
    )


def test_a_stop_or_max_tokens_inside_a_verify_ends_where_mtp_off_does(
    sparse64: LoadedModel, prompt: Prompt, plain_run: dict[str, tuple[int, ...]]
) -> None:
    reqs = requests(prompt)
    truth = full_tokens(reqs, plain_run)
    stop_at = plain_run["r0"][9]  # greedy r0's 10th token becomes a stop id
    cut = [
        replace(reqs[0], sampling=replace(reqs[0].sampling, stop_token_ids=(stop_at,))),
        replace(reqs[1], sampling=replace(reqs[1].sampling, max_tokens=11)),
    ]
    plain = serve(sparse64, config(0), cut, None)[1]
    oracle = OracleDrafter(truth, sparse64.config.vocab_size)
    got = serve(sparse64, config(K), cut, oracle)[1]
    assert got == plain
    assert len(got["r1"]) == 11 and got["r0"][-1] == stop_at
    assert len(got["r0"]) == plain_run["r0"].index(stop_at) + 1


def test_preemption_under_speculation_keeps_the_tokens(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    # 8 blocks of 16: two 40-token prompts fit, growing both to 80 tokens forces preemption
    cfg = config(K, num_blocks=8, max_model_len=128)
    reqs = [EngineRequest(f"p{i}", prompt(40, 10 + i), greedy(40)) for i in range(3)]
    plain = serve(sparse64, replace(cfg, mtp_draft_tokens=0), reqs, None)[1]
    oracle = OracleDrafter(full_tokens(reqs, plain), sparse64.config.vocab_size)
    engine, got = serve(sparse64, cfg, reqs, oracle)
    assert engine.stats().num_preemptions > 0
    assert got == plain


def test_a_prefix_hit_gives_up_its_last_block_and_keeps_the_tokens(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    prefix = prompt(160, 7)  # 10 whole blocks
    first, second = prefix + prompt(20, 8), prefix + prompt(15, 9)
    plain = Engine(sparse64, config(0))
    engine = Engine(sparse64, config(K))
    want = [plain.generate(p, greedy(12)).output_token_ids for p in (first, second)]
    a, b = (engine.generate(p, greedy(12)) for p in (first, second))
    assert [a.output_token_ids, b.output_token_ids] == want
    # the 10th block's last MTP row read the token after it: 9 blocks are served from cache
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 144


def test_the_paged_mtp_rows_propose_the_one_sequence_drafters_drafts(
    sparse64: LoadedModel, prompt: Prompt
) -> None:
    """Concurrent, chunked and prefix-hit requests: every step's drafts equal those the
    one-sequence MtpDrafter (its own contiguous MTP cache) proposes at the same position."""
    prefix = prompt(100, 3)
    prompts = [prefix + prompt(60, 4), prefix + prompt(30, 5), prompt(200, 6)]
    reqs = [EngineRequest(f"q{i}", p, greedy(20)) for i, p in enumerate(prompts)]
    spy = RecordingDrafter()
    engine = Engine(sparse64, config(K), drafter=spy)
    spy.watch(engine)
    engine.generate(reqs[0].prompt_token_ids, greedy(20), request_id="warm")  # fills the cache
    run_all(engine, reqs)
    model = inner(sparse64)
    for r in reqs:
        recorder = _OneSequenceRecorder(MtpDrafter(model, 400))
        MtpSpeculator(model, K, 400, recorder).generate(list(r.prompt_token_ids), 20)
        common = sorted(set(recorder.seen) & set(spy.seen[r.request_id]))
        assert len(common) >= 15
        for start in common:
            ours, theirs = spy.seen[r.request_id][start], recorder.seen[start]
            n = min(len(ours), len(theirs))
            assert ours[:n] == theirs[:n], (r.request_id, start)


class _OneSequenceRecorder:
    """Wraps the one-sequence MtpDrafter, recording its proposals by the verify's start."""

    def __init__(self, inner_drafter: MtpDrafter) -> None:
        self.inner = inner_drafter
        self.seen: dict[int, tuple[int, ...]] = {}

    def extend(self, normed: torch.Tensor, next_ids: list[int], start: int) -> None:
        self.inner.extend(normed, next_ids, start)

    def propose(self, k: int) -> list[int]:
        drafts = self.inner.propose(k)
        self.seen[self.inner.cache.length] = tuple(drafts)
        return drafts


def hisparse_config(loaded: LoadedModel, blocks: int = 80) -> EngineConfig:
    """MTP over HiSparse's tiers: a host pool of `blocks` whole blocks (the MTP layer's rows
    included) and hot buffers of top-k + 1 rows, smaller than the longer contexts."""
    spec = loaded.config.kv_spec(16, 1, torch.float64, mtp_layers=1)  # type: ignore[call-arg]
    gib = blocks * spec.bytes_per_block / (1 << 30)
    return replace(config(K), hisparse_host_pool_gib=gib, hisparse_hot_slots=INDEX_TOPK + 1)


def test_mtp_over_hisparse_keeps_the_tokens_and_drafts_as_on_the_device(
    sparse64: LoadedModel, prompt: Prompt, plain_run: dict[str, tuple[int, ...]]
) -> None:
    """The MTP layer's rows are one more layer of both HiSparse tiers; drafts read the host
    tier directly (their scratch rows never enter a hot buffer). MTP on HiSparse == MTP off,
    with forced acceptances, and its drafts equal the all-on-device MTP engine's."""
    reqs = requests(prompt)
    oracle = OracleDrafter(full_tokens(reqs, plain_run), sparse64.config.vocab_size)
    engine, got = serve(sparse64, hisparse_config(sparse64), reqs, oracle)
    assert got == plain_run
    spec = engine.stats().spec
    assert spec is not None and spec.num_accepted_tokens > spec.num_drafts
    assert engine.stats().hisparse_hot_misses > 0 and engine.stats().hisparse_hot_requests == 0
    spies = RecordingDrafter(), RecordingDrafter()
    greedy_reqs = [r for r in reqs if r.sampling.temperature == 0.0]
    for spy, cfg in zip(spies, (config(K), hisparse_config(sparse64)), strict=True):
        spied = Engine(sparse64, cfg, drafter=spy)
        spy.watch(spied)
        assert run_all(spied, greedy_reqs) == {r.request_id: plain_run[r.request_id]
                                               for r in greedy_reqs}  # fmt: skip
    assert spies[1].seen == spies[0].seen and spies[0].seen
