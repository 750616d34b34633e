"""MTP speculation on a parallel engine's ranks (float64 tiny sparse-mla on real gloo ranks,
index top-k 64 below the contexts): the ranks propose the drafts, verify them in the batched
trunk forward and write the MTP rows of what the engine's verdict kept. Over PCP2×DCP2
(interleave 1 ag_rs, interleave 4 a2a), PCP2×EP2 and DP2×EP2, concurrent chunked requests,
greedy and seeded-sampled, give exactly the tokens of MTP off on one rank, with the ranks' own
drafts and with an oracle that forces acceptances of every length; the drafts the ranks propose
are the one-rank MTP engine's at every step (on HiSparse DP2×EP2 ranks too); preemption and a
prefix hit keep the tokens; the ranks release every sequence."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.runtime.engine.conftest import random_prompt
from tests.runtime.engine.ranks_config import SPARSE_LAYOUTS, ranks_config
from tests.runtime.engine.sparse_mla_helpers import Prompt, RecordingDrafter, greedy, run_all
from tests.runtime.engine.spec.test_mtp_engine import K, OracleDrafter, full_tokens
from tests.runtime.engine.spec.test_mtp_engine import requests as mtp_requests

from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.ranks.ranked_runner import RankedRunner
from loom_runtime.engine.runner import TokenWork
from loom_runtime.engine.spec.mtp_runner import Drafter
from loom_runtime.engine.types import EngineRequest
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK, init_tiny_sparse_mla
from loom_runtime.parallel.layout import ParallelLayout

LENGTHS = [5, 40, 70, 130]  # > INDEX_TOPK (64) from 70 on; > 96 (one chunk) at 130
ONE_RANK = ParallelLayout()

Outputs = dict[str, tuple[int, ...]]


def config(layout: ParallelLayout, mtp: int = K, **kw: object) -> EngineConfig:
    return ranks_config(layout, mtp_draft_tokens=mtp, **kw)


def requests(prompt: Prompt) -> list[EngineRequest]:
    return mtp_requests(prompt, 16, LENGTHS, seed=700)


class ProbedOracle(OracleDrafter):
    """The oracle's drafts go to the verify; the runner's own proposal for the same works is
    recorded by the verify's start, so two engines' real drafts can be compared while both
    follow the oracle's acceptances."""

    def __init__(self, truth: Outputs, vocab: int) -> None:
        super().__init__(truth, vocab)
        self.real = RecordingDrafter()

    def propose(self, works: Sequence[TokenWork]) -> list[tuple[int, ...]]:
        self.real.propose(works)
        return super().propose(works)


def build(checkpoint: Path, cfg: EngineConfig, drafter: Drafter | None) -> Engine:
    """An engine of `cfg` (on ranks when cfg.parallel asks) with `drafter`; a spy drafter
    is set to watch it."""
    engine = Engine.from_checkpoint(checkpoint, cfg, drafter=drafter)
    if isinstance(drafter, ProbedOracle):
        drafter.real.watch(engine)
    elif isinstance(drafter, RecordingDrafter):
        drafter.watch(engine)
    return engine


def serve(
    checkpoint: Path, cfg: EngineConfig, reqs: list[EngineRequest], drafter: Drafter | None
) -> tuple[Engine, Outputs]:
    """Run `reqs` to the end on a new engine, shut down; the engine (stats readable) and the
    tokens. Checks that nothing stays allocated."""
    engine = build(checkpoint, cfg, drafter)
    try:
        got = run_all(engine, reqs)
        if isinstance(engine._runner, RankedRunner):
            engine._runner.flush()  # the last releases
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert stats.num_free_blocks == stats.num_blocks
    assert all(rank.sequences == 0 and rank.kv_tokens == 0 for rank in stats.ranks)
    return engine, got


@pytest.fixture(scope="module")
def plain_run(sparse_dir: Path) -> Outputs:
    """MTP off on one rank: the tokens every run here must give."""
    return serve(sparse_dir, config(ONE_RANK, mtp=0), requests(random_prompt), None)[1]


def oracle(reqs: list[EngineRequest], plain: Outputs, loaded: LoadedModel) -> ProbedOracle:
    return ProbedOracle(full_tokens(reqs, plain), loaded.config.vocab_size)


@pytest.fixture(scope="module")
def one_rank_probe(sparse_dir: Path, sparse64: LoadedModel, plain_run: Outputs) -> ProbedOracle:
    """The one-rank MTP engine under the oracle: its real drafts at every verify."""
    reqs = requests(random_prompt)
    probe = oracle(reqs, plain_run, sparse64)
    assert serve(sparse_dir, config(ONE_RANK), reqs, probe)[1] == plain_run
    return probe


@pytest.mark.parametrize(("layout", "backend"), SPARSE_LAYOUTS)
def test_forced_acceptances_on_ranks_keep_the_tokens_and_the_drafts(
    sparse_dir: Path,
    sparse64: LoadedModel,
    plain_run: Outputs,
    one_rank_probe: ProbedOracle,
    layout: ParallelLayout,
    backend: str,
) -> None:
    reqs = requests(random_prompt)
    probe = oracle(reqs, plain_run, sparse64)
    engine, got = serve(sparse_dir, config(layout, dcp_backend=backend), reqs, probe)
    assert got == plain_run
    spec = engine.stats().spec
    assert spec is not None
    assert all(n > 0 for n in spec.accepted_per_pos)  # every draft position was accepted
    assert spec.num_accepted_tokens > spec.num_drafts  # more than one token per verify
    assert probe.real.seen == one_rank_probe.real.seen  # the ranks' MTP rows draft as one rank's
    assert sum(len(v) for v in probe.real.seen.values()) >= 4 * len(reqs)


def test_the_ranks_own_drafts_give_the_tokens_of_mtp_off(
    sparse_dir: Path, plain_run: Outputs
) -> None:
    engine, got = serve(
        sparse_dir, config(ParallelLayout(dp=2, ep=2)), requests(random_prompt), None
    )
    assert got == plain_run
    spec = engine.stats().spec
    assert spec is not None and spec.num_drafts > 0 and spec.num_draft_tokens >= spec.num_drafts


def test_preemption_under_speculation_on_ranks_keeps_the_tokens(
    sparse_dir: Path, sparse64: LoadedModel, prompt: Prompt
) -> None:
    """8 blocks of 16: two 40-token prompts fit, growing both to 80 tokens forces preemption;
    the ranks replace a recomputed sequence and its MTP rows."""
    reqs = [EngineRequest(f"p{i}", prompt(40, 10 + i), greedy(40)) for i in range(3)]
    small = {"num_blocks": 8, "max_model_len": 128}
    plain = serve(sparse_dir, config(ONE_RANK, mtp=0, **small), reqs, None)[1]
    cfg = config(ParallelLayout(pcp=2, dcp=2), **small)
    engine, got = serve(sparse_dir, cfg, reqs, oracle(reqs, plain, sparse64))
    assert engine.stats().num_preemptions > 0
    assert got == plain


def test_a_prefix_hit_on_ranks_gives_up_its_last_block_and_keeps_the_tokens(
    sparse_dir: Path, prompt: Prompt
) -> None:
    """The hit's rows, MTP layer's included, go to the ranks from the engine's mirrored pool;
    as on one rank, the last block's MTP row read the token after it, so it is recomputed."""
    prefix = prompt(160, 7)  # 10 whole blocks
    first, second = prefix + prompt(20, 8), prefix + prompt(15, 9)
    reqs = [EngineRequest("a", first, greedy(12)), EngineRequest("b", second, greedy(12))]
    plain = serve(sparse_dir, config(ONE_RANK, mtp=0), reqs, None)[1]
    engine = Engine.from_checkpoint(sparse_dir, config(ParallelLayout(pcp=2, dcp=2)))
    try:
        a, b = (engine.generate(r.prompt_token_ids, greedy(12)) for r in reqs)
        spec = engine.stats().spec
    finally:
        engine.shutdown()
    assert [a.output_token_ids, b.output_token_ids] == [plain["a"], plain["b"]]
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 144
    assert spec is not None and spec.num_drafts > 0


def test_prefix_hits_on_rows_whose_verdict_is_pending_read_their_mtp_rows(
    sparse_dir: Path, prompt: Prompt
) -> None:
    """DP2×EP2 runs a prompt chunk in the batched forward, so every MTP row of the chunk waits
    for the engine's verdict on the next message. A hit on those rows in the next step (the
    request still running), or after the request ended with that chunk (max_tokens 1), must
    read them written (the ranks settle first): its drafts are then the one-rank engine's."""
    shared = prompt(96, 20)
    running = EngineRequest("a", shared + prompt(54, 21), greedy(12))
    hit_running = EngineRequest("b", shared + prompt(40, 22), greedy(12))
    ended = EngineRequest("c", prompt(180, 23), greedy(1))
    hit_ended = EngineRequest("d", ended.prompt_token_ids[:160] + prompt(15, 24), greedy(12))

    def script(engine: Engine) -> dict[str, CompletedRequest]:
        got = {r.request_id: OutputCollector(r) for r in (running, hit_running, ended, hit_ended)}
        try:
            engine.add_request(running, got["a"])
            engine.step()  # a's first chunk: 96 tokens, their MTP rows wait for the verdict
            engine.add_request(hit_running, got["b"])
            while not (got["a"].done.is_set() and got["b"].done.is_set()):
                engine.step()
            for r in (ended, hit_ended):
                engine.add_request(r, got[r.request_id])
                while not got[r.request_id].done.is_set():
                    engine.step()
        finally:
            engine.shutdown()
        return {k: c.result() for k, c in got.items()}

    spies = RecordingDrafter(), RecordingDrafter()
    one = script(build(sparse_dir, config(ONE_RANK), spies[0]))
    ranked = script(build(sparse_dir, config(ParallelLayout(dp=2, ep=2)), spies[1]))
    assert {k: r.output_token_ids for k, r in ranked.items()} == {
        k: r.output_token_ids for k, r in one.items()
    }
    assert ranked["b"].num_cached_tokens == 80 and ranked["d"].num_cached_tokens == 144
    assert spies[1].seen == spies[0].seen and set(spies[0].seen) >= {"b", "d"}


def test_fp8_kv_under_speculation_on_ranks_drafts_as_the_one_rank_fp8_engine(
    sparse_dir: Path, prompt: Prompt
) -> None:
    """The ranks round the MTP layer's rows through fp8 as a one-rank fp8 pool keeps them, so
    the tokens and every draft equal the one-rank fp8 MTP engine's."""
    fp8 = Fp8Format(16)
    reqs = [EngineRequest(f"f{i}", prompt(n, 40 + i), greedy(16)) for i, n in enumerate(LENGTHS)]
    spies = RecordingDrafter(), RecordingDrafter()
    one = serve(sparse_dir, config(ONE_RANK, kv_fp8=fp8), reqs, spies[0])[1]
    cfg = config(ParallelLayout(pcp=2, dcp=2), kv_fp8=fp8)
    assert serve(sparse_dir, cfg, reqs, spies[1])[1] == one
    assert spies[1].seen == spies[0].seen and spies[0].seen


def test_a_weight_sync_on_drafting_ranks_drafts_with_the_new_mtp_layer(
    sparse_dir: Path, prompt: Prompt, tmp_path: Path
) -> None:
    """Drained, DP2×EP2 drafting ranks load v2 (its MTP layer too): then the tokens and drafts
    are the one-rank v2 MTP engine's."""
    v2 = init_tiny_sparse_mla(tmp_path / "v2", seed=1)
    reqs = [EngineRequest(f"w{i}", prompt(n, 80 + i), greedy(12)) for i, n in enumerate(LENGTHS)]
    spies = RecordingDrafter(), RecordingDrafter()
    want = serve(v2, config(ONE_RANK), reqs, spies[0])[1]
    engine = build(sparse_dir, config(ParallelLayout(dp=2, ep=2)), spies[1])
    try:
        run_all(engine, [EngineRequest("v1", prompt(50, 1), greedy(8))])
        assert engine.pause(timeout=30)
        engine.load_weights(str(v2), "v2")
        engine.resume()
        spies[1].seen.clear()
        got = run_all(engine, reqs)
    finally:
        engine.shutdown()
    assert got == want
    assert spies[1].seen == spies[0].seen and spies[0].seen


def test_hisparse_ranks_speculate_with_the_one_rank_drafts(
    sparse_dir: Path,
    sparse64: LoadedModel,
    plain_run: Outputs,
    one_rank_probe: ProbedOracle,
) -> None:
    """DP2×EP2 ranks holding their requests in HiSparse tiers (hot buffers of top-k + 1 rows,
    so decodes and drafts miss and hit) give MTP off's tokens under forced acceptances of
    every length, and every draft the all-on-device one-rank MTP engine proposes: the MTP
    layer's rows through the tiers, and no stale hot row of a rejected draft or a scratch row."""
    reqs = requests(random_prompt)
    probe = oracle(reqs, plain_run, sparse64)
    tiers = dict(hisparse_host_pool_gib=0.004, hisparse_hot_slots=INDEX_TOPK + 1, num_blocks=None)
    engine, got = serve(sparse_dir, config(ParallelLayout(dp=2, ep=2), **tiers), reqs, probe)
    assert got == plain_run
    assert probe.real.seen == one_rank_probe.real.seen
    stats = engine.stats()
    assert stats.hisparse_hot_hits > 0 and stats.hisparse_hot_misses > 0
