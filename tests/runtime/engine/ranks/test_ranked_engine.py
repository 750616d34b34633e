"""A parallel engine (config.parallel) runs every forward on real gloo rank processes and gives
the one-rank engine's greedy tokens: PCP2×DCP2 (interleave 1 and 4, ag_rs and a2a) and EP2,
over concurrent requests of different lengths with chunked prefill and preemption (a step's
decodes in one forward on the ranks), index top-k (64) below the contexts. Each rank's KV
equals the planner's per-rank figure, the ranks release every finished request, a weight sync
or a trainer's push reloads every rank, and a rank that dies takes the engine down with
RankFailure instead of a hang. Settings the ranks cannot
serve are refused with a readable error."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.runtime.engine.push_helpers import generate_around_a_push, staged_push
from tests.runtime.engine.ranks_config import BLOCK, SPARSE_LAYOUTS, drop_layer, ranks_config
from tests.runtime.engine.sparse_mla_helpers import Prompt, greedy, inner, one_sequence, run_all

from loom_operator.fleet.capacity import dcp_local_length
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.ranks.ranked_runner import RankedRunner
from loom_runtime.engine.types import EngineRequest, RankKVStats, RequestOutput
from loom_runtime.errors import CheckpointError
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK, init_tiny_sparse_mla
from loom_runtime.parallel.layout import LayoutError, ParallelLayout
from loom_runtime.parallel.ranks import RankFailure


def config(layout: ParallelLayout, **kw: object) -> EngineConfig:
    return ranks_config(layout, **kw)


@pytest.mark.parametrize(("layout", "backend"), SPARSE_LAYOUTS)
def test_concurrent_chunked_requests_on_ranks_equal_one_rank(
    sparse_dir: Path, sparse64: LoadedModel, prompt: Prompt, layout: ParallelLayout, backend: str
) -> None:
    lengths = [5, 40, 70, 130, 260]  # > INDEX_TOPK from 70 on; > 96 (one chunk) from 130 on
    assert INDEX_TOPK == 64
    reqs = [EngineRequest(f"r{i}", prompt(n, 300 + i), greedy(8)) for i, n in enumerate(lengths)]
    engine = Engine.from_checkpoint(sparse_dir, config(layout, dcp_backend=backend))
    try:
        got = run_all(engine, reqs)
        stats = engine.stats()
        runner = engine._runner
    finally:
        engine.shutdown()
    for r in reqs:
        assert got[r.request_id] == one_sequence(inner(sparse64), r.prompt_token_ids, 8)
    assert isinstance(runner, RankedRunner)
    # A step's decodes ran as one forward on the ranks: fewer forwards than works.
    assert runner.rank_forwards < runner.works_run - len(reqs)
    assert stats.num_free_blocks == stats.num_blocks
    assert engine._model.device.type == "meta"  # the engine's process holds no weights
    assert len(stats.ranks) == layout.world
    assert all(rank.sequences == 0 and rank.kv_tokens == 0 for rank in stats.ranks)


def test_dp_replicas_each_run_their_own_requests_and_share_the_experts(
    sparse_dir: Path, sparse64: LoadedModel, prompt: Prompt
) -> None:
    """DP2 × EP2 (the reference decode's DP × EP on 2 ranks): requests are spread over the two
    replicas, each rank keeps and attends over its own requests' rows only, and their tokens
    meet in the expert exchanges; a replica with fewer forwards in a step makes the rest of the
    exchanges empty, so neither waits on the other."""
    lengths = [30, 90, 200, 7]
    reqs = [EngineRequest(f"r{i}", prompt(n, 500 + i), greedy(12)) for i, n in enumerate(lengths)]
    got = {r.request_id: OutputCollector(r) for r in reqs}
    engine = Engine.from_checkpoint(sparse_dir, config(ParallelLayout(dp=2, ep=2)))
    try:
        for r in reqs:
            engine.add_request(r, got[r.request_id])
        ranks: tuple[RankKVStats, ...] = ()
        for _ in range(20):  # until every request is on the ranks (96-token steps)
            engine.step()
            ranks = engine.stats().ranks
            if sum(r.sequences for r in ranks) == len(reqs):
                break
        while not all(c.done.is_set() for c in got.values()):
            engine.step()
    finally:
        engine.shutdown()
    assert [r.sequences for r in ranks] == [2, 2]  # r0, r2 on replica 0; r1, r3 on replica 1
    assert ranks[0].kv_tokens > lengths[0] + lengths[2] - 1
    assert ranks[1].kv_tokens > lengths[1] + lengths[3] - 1
    for r in reqs:
        want = one_sequence(inner(sparse64), r.prompt_token_ids, 12)
        assert got[r.request_id].result().output_token_ids == want


def test_each_dp_replica_keeps_within_its_own_blocks(
    sparse_dir: Path, sparse64: LoadedModel, prompt: Prompt
) -> None:
    """num_blocks is each replica's (8 of 16 tokens): the pool counts both (16), and five
    40-token prompts growing to 80 tokens (5 blocks each) overflow a replica before the pool,
    so a replica that runs short preempts its own newest request; no rank ever holds more than
    its 8 blocks, and the tokens are one rank's."""
    reqs = [EngineRequest(f"p{i}", prompt(40, 20 + i), greedy(40)) for i in range(5)]
    cfg = config(ParallelLayout(dp=2, ep=2), num_blocks=8, max_model_len=128)
    engine = Engine.from_checkpoint(sparse_dir, cfg)
    got = {r.request_id: OutputCollector(r) for r in reqs}
    most = [0, 0]  # blocks each rank held at most
    try:
        for r in reqs:
            engine.add_request(r, got[r.request_id])
        while not all(c.done.is_set() for c in got.values()):
            engine.step()
            for rank in engine.stats().ranks:
                held = rank.kv_bytes // (BLOCK * rank.kv_bytes_per_token)
                most[rank.rank] = max(most[rank.rank], held)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert stats.num_blocks == 16
    assert stats.num_preemptions > 0
    assert min(most) >= 5 and max(most) <= 8  # both replicas used, neither past its blocks
    for r in reqs:
        want = one_sequence(inner(sparse64), r.prompt_token_ids, 40)
        assert got[r.request_id].result().output_token_ids == want


def test_each_rank_holds_its_dcp_share_as_the_planner_predicts(
    sparse_dir: Path, prompt: Prompt
) -> None:
    layout = ParallelLayout(pcp=2, dcp=2, interleave=4)
    engine = Engine.from_checkpoint(sparse_dir, config(layout))
    try:
        req = EngineRequest("long", prompt(301, 5), greedy(50))
        engine.add_request(req, lambda out: None)
        while engine.stats().num_generation_tokens < 10:  # the 10th is sampled, not yet fed
            engine.step()
        ranks = engine.stats().ranks
    finally:
        engine.shutdown()
    context = 301 + 9  # every token fed to the model has its rows on the ranks
    for rank in ranks:
        assert rank.kv_tokens == dcp_local_length(context, 2, 4, rank.rank)
        blocks = -(-rank.kv_tokens // BLOCK)
        assert rank.kv_bytes == blocks * BLOCK * rank.kv_bytes_per_token
    assert sum(r.kv_tokens for r in ranks) == context


def test_preempted_requests_restart_on_the_ranks_with_the_same_tokens(
    sparse_dir: Path, sparse64: LoadedModel, prompt: Prompt
) -> None:
    """8 blocks of 16: two 40-token prompts fit, growing both to 80 tokens forces preemption;
    the ranks replace a recomputed sequence, and the tokens equal one rank's."""
    reqs = [EngineRequest(f"p{i}", prompt(40, 10 + i), greedy(40)) for i in range(3)]
    layout = ParallelLayout(pcp=2, dcp=2)
    engine = Engine.from_checkpoint(sparse_dir, config(layout, num_blocks=8, max_model_len=128))
    try:
        got = run_all(engine, reqs)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert stats.num_preemptions > 0
    for r in reqs:
        assert got[r.request_id] == one_sequence(inner(sparse64), r.prompt_token_ids, 40)


def test_a_rank_that_dies_fails_the_step_with_rank_failure(
    sparse_dir: Path, prompt: Prompt
) -> None:
    engine = Engine.from_checkpoint(sparse_dir, config(ParallelLayout(pcp=2, dcp=2)))
    try:
        engine.add_request(EngineRequest("a", prompt(40, 1), greedy(50)), lambda out: None)
        engine.step()
        os.kill(engine._ranks.pids[1], signal.SIGKILL)  # type: ignore[union-attr]
        with pytest.raises(RankFailure, match="rank"):
            for _ in range(50):
                engine.step()
    finally:
        engine.shutdown()


def test_settings_the_ranks_cannot_serve_are_refused(sparse_dir: Path) -> None:
    with pytest.raises(LayoutError, match="pcp > 1 cannot be combined with dp > 1"):
        config(ParallelLayout(dp=2, pcp=2))
    with pytest.raises(ValueError, match="HiSparse on ranks runs on DP × EP ranks"):
        config(ParallelLayout(pcp=2), hisparse_host_pool_gib=1.0)
    with pytest.raises(ValueError, match="dcp_backend"):
        config(ParallelLayout(pcp=2), dcp_backend="ring")


def test_a_llama_model_on_pcp_ranks_is_refused_before_any_rank_starts(tiny_dir: Path) -> None:
    cfg = EngineConfig(parallel=ParallelLayout(pcp=2), max_model_len=64, num_blocks=16)
    with pytest.raises(LayoutError, match="splits over tp only"):
        Engine.from_checkpoint(tiny_dir, cfg)


def test_an_engine_given_no_ranks_for_a_parallel_layout_is_refused(sparse64: LoadedModel) -> None:
    with pytest.raises(LayoutError, match="needs 2 ranks"):
        Engine(sparse64, config(ParallelLayout(pcp=2)))


def test_a_weight_sync_reloads_every_rank_and_a_misfit_checkpoint_changes_none(
    sparse_dir: Path, prompt: Prompt, tmp_path: Path
) -> None:
    """Drained, a PCP2×DCP2×EP2 engine loads v2 on both ranks (each re-shards its experts) and
    then gives v2's one-rank tokens; a checkpoint whose shapes do not fit is refused before any
    rank changes, and the engine still gives v1's."""
    v2 = init_tiny_sparse_mla(tmp_path / "v2", seed=1)
    misfit = drop_layer(init_tiny_sparse_mla(tmp_path / "misfit", seed=2), 3)
    req = prompt(70, 3)
    engine = Engine.from_checkpoint(sparse_dir, config(ParallelLayout(pcp=2, dcp=2, ep=2)))
    try:
        v1_tokens = engine.generate(req, greedy(8)).output_token_ids
        assert engine.pause(timeout=30)
        with pytest.raises(CheckpointError, match="missing"):
            engine.load_weights(str(misfit), "bad")
        engine.load_weights(str(v2), "v2")
        engine.resume()
        got = engine.generate(req, greedy(8))
        assert got.weights_version == "v2"
        assert engine.pause(timeout=30)
        with pytest.raises(CheckpointError):
            engine.load_weights(str(misfit), "bad")
        engine.load_weights(str(sparse_dir), "v1")
        engine.resume()
        again = engine.generate(req, greedy(8)).output_token_ids
    finally:
        engine.shutdown()
    v2_model = load_model(v2, dtype=torch.float64)
    assert got.output_token_ids == one_sequence(inner(v2_model), req, 8) != v1_tokens
    assert again == v1_tokens


def test_a_push_into_a_ranked_worker_reloads_every_rank_from_the_staged_checkpoint(
    sparse_dir: Path, prompt: Prompt, tmp_path: Path
) -> None:
    """The whole model's tensors pushed (as a trainer sends them) into a PCP2×DCP2×EP2 engine:
    each rank re-shards the staged push and the engine gives v2's one-rank tokens."""
    v2 = init_tiny_sparse_mla(tmp_path / "v2", seed=1)
    req = prompt(70, 3)
    engine = Engine.from_checkpoint(sparse_dir, config(ParallelLayout(pcp=2, dcp=2, ep=2)))
    v1_tokens, got = generate_around_a_push(engine, req, greedy(8), v2)
    v2_model = load_model(v2, dtype=torch.float64)
    assert got.weights_version == "v2"
    assert got.output_token_ids == one_sequence(inner(v2_model), req, 8) != v1_tokens


PCP_DCP_EP = ParallelLayout(pcp=2, dcp=2, ep=2)


@pytest.mark.parametrize(
    ("layout", "kv"),
    [(PCP_DCP_EP, "keep"), (PCP_DCP_EP, "recompute"), (ParallelLayout(dp=2, ep=2), "keep")],
    ids=["pcp2-dcp2-ep2-keep", "pcp2-dcp2-ep2-recompute", "dp2-ep2-keep"],
)  # fmt: skip
def test_a_keep_swap_on_ranks_gives_one_ranks_tokens_and_versions(
    sparse_dir: Path, prompt: Prompt, tmp_path: Path, layout: ParallelLayout, kv: str
) -> None:
    """A push swapped in under two running requests (one still prefilling in chunks) on PCP/DCP
    or DP×EP ranks: each rank's live sequences go on under v2 over the rows they hold (keep),
    or are released and re-prefilled (recompute); the tokens and each token's version equal
    one rank's across the same swap at the same step, nothing aborted."""
    v2 = load_file(str(init_tiny_sparse_mla(tmp_path / "v2", seed=1) / "model.safetensors"))
    prompts = [prompt(70, 3), prompt(400, 4)]  # r1 prefills in 96-token chunks past the swap

    def run(engine: Engine) -> list[list[RequestOutput]]:
        outs: list[list[RequestOutput]] = [[], []]
        try:
            staged = staged_push(engine, v2, "v2")
            for i, p in enumerate(prompts):
                engine.add_request(EngineRequest(f"r{i}", p, greedy(12)), outs[i].append)
            while sum(len(o.new_token_ids) for o in outs[0]) < 4:
                engine.step()
            engine.load_pushed_keep(staged, kv)
            staged.discard()
            while engine.in_flight():
                engine.step()
            assert engine.stats().num_requests_aborted == 0
        finally:
            engine.shutdown()
        return outs

    ranked = run(Engine.from_checkpoint(sparse_dir, config(layout)))
    one = run(Engine(load_model(sparse_dir, dtype=torch.float64), config(ParallelLayout())))
    for got, want in zip(ranked, one, strict=True):
        assert [(o.new_token_ids, o.weights_version) for o in got] == [
            (o.new_token_ids, o.weights_version) for o in want
        ]
        assert got[-1].finished and sum(len(o.new_token_ids) for o in got) == 12
    versions = [[v for o in outs for v in [o.weights_version] * len(o.new_token_ids)]
                for outs in ranked]  # fmt: skip
    assert versions == [["v1"] * 4 + ["v2"] * 8, ["v2"] * 12]


@pytest.mark.parametrize(
    "layout",
    [ParallelLayout(pcp=2, dcp=2, interleave=4), ParallelLayout(pcp=2, ep=2)],
    ids=["pcp2-dcp2-i4", "pcp2-ep2"],
)
def test_a_prefix_hit_on_ranks_is_seeded_from_the_pool_with_identical_tokens(
    sparse_dir: Path, sparse64: LoadedModel, prompt: Prompt, layout: ParallelLayout
) -> None:
    """The engine's pool mirrors the ranks' rows; a second request sharing 160 prompt tokens
    (10 blocks) is admitted with them cached, and the ranks' new sequence starts from the
    pool's rows (each DCP rank keeping its own tokens): its tokens equal one rank's."""
    prefix = prompt(160, 7)
    first, second = prefix + prompt(20, 8), prefix + prompt(15, 9)
    engine = Engine.from_checkpoint(sparse_dir, config(layout))
    try:
        a = engine.generate(first, greedy(6))
        b = engine.generate(second, greedy(6))
        ranks = engine.stats().ranks
    finally:
        engine.shutdown()
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 160
    for got, p in ((a, first), (b, second)):
        assert got.output_token_ids == one_sequence(inner(sparse64), p, 6)
    assert all(r.sequences == 0 for r in ranks)


def test_fp8_kv_on_ranks_gives_the_one_rank_fp8_engines_tokens(
    sparse_dir: Path, sparse64: LoadedModel, prompt: Prompt
) -> None:
    """Every rank rounds its rows through fp8 as a one-rank fp8 pool keeps them (latent and
    index keys e4m3 with group scales, RoPE BF16), so concurrent chunked requests on PCP2×DCP2
    ranks give the one-rank fp8 engine's tokens, which differ from full precision's."""
    fp8 = Fp8Format(16)
    reqs = [
        EngineRequest(f"f{i}", prompt(n, 500 + i), greedy(8)) for i, n in enumerate([40, 130, 260])
    ]
    one = Engine(sparse64, config(ParallelLayout(), kv_fp8=fp8))
    want = run_all(one, reqs)
    engine = Engine.from_checkpoint(sparse_dir, config(ParallelLayout(pcp=2, dcp=2), kv_fp8=fp8))
    try:
        got = run_all(engine, reqs)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert got == want
    # the ranks store packed rows: a token costs each rank what it costs the fp8 pool
    assert all(r.kv_bytes_per_token == stats.kv_bytes_per_token for r in stats.ranks)
    assert stats.kv_bytes_per_token == one.stats().kv_bytes_per_token


def test_an_offloaded_prefix_reloads_into_the_pool_and_seeds_the_ranks(
    sparse_dir: Path, sparse64: LoadedModel, prompt: Prompt
) -> None:
    """CPU KV offload on ranks (the reference prefill's agentic-turn reuse): 8 blocks of 16, so
    the second prompt evicts the first's cached blocks to the host tier; the first prompt's
    next turn reloads them into the mirrored pool, the ranks are seeded from it, and every
    turn gives one rank's tokens, with fewer tokens run than recomputing."""
    first, other = prompt(81, 1), prompt(100, 2)
    cfg = config(ParallelLayout(pcp=2, dcp=2), num_blocks=8, max_model_len=128,
                 kv_offload_gib=0.01)  # fmt: skip
    engine = Engine.from_checkpoint(sparse_dir, cfg)
    try:
        got = [engine.generate(p, greedy(8)) for p in (first, other, first)]
        stats = engine.stats()
    finally:
        engine.shutdown()
    for result, p in zip(got, (first, other, first), strict=True):
        assert result.output_token_ids == one_sequence(inner(sparse64), p, 8)
    assert stats.kv_offloaded_blocks > 0 and stats.kv_reload_tokens > 0
    assert got[2].num_cached_tokens >= stats.kv_reload_tokens
