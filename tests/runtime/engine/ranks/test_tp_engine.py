"""A tensor-parallel llama engine (config.parallel tp 2) runs every forward on two real gloo
rank processes — each with half the q heads and their kv heads, half the MLP's columns, its own
paged pool indexed by the engine's block tables, o_proj and down_proj all-reduced — and gives
the one-rank engine's greedy tokens (float64): concurrent requests of different lengths with
chunked prefill, a prefix-cache hit, preemption, a weight sync, a trainer's push (also swapped
in under a running request, mode keep). Each rank holds half the KV bytes of a token and less
than the whole model; a rank that dies takes the engine down with RankFailure instead of a
hang; settings TP cannot serve are refused with a readable error."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.runtime.engine.push_helpers import generate_around_a_push, staged_push
from tests.runtime.engine.ranks_config import BLOCK, drop_layer, ranks_config
from tests.runtime.engine.sparse_mla_helpers import Prompt, greedy, run_all

from loom_operator.fleet.kv_layout import GQAAttention, ModelShape, kv_bytes_per_token
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.ranks.tp_runner import TpRunner
from loom_runtime.engine.types import EngineRequest, RequestOutput
from loom_runtime.errors import CheckpointError
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.config import ModelConfig
from loom_runtime.models.llama import LlamaForCausalLM
from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.tiny import init_tiny
from loom_runtime.parallel.layout import LayoutError, ParallelLayout
from loom_runtime.parallel.llama.tp import weight_bytes
from loom_runtime.parallel.ranks import RankFailure

TP2 = ParallelLayout(tp=2)


def config(layout: ParallelLayout = TP2, **kw: object) -> EngineConfig:
    return ranks_config(layout, **kw)


def one_rank(
    loaded: LoadedModel, reqs: list[EngineRequest], **kw: object
) -> dict[str, tuple[int, ...]]:
    engine = Engine(loaded, config(ParallelLayout(), **kw))
    try:
        return run_all(engine, reqs)
    finally:
        engine.shutdown()


def test_concurrent_chunked_requests_on_tp2_equal_one_rank(
    tiny_dir: Path, tiny64: LoadedModel, prompt: Prompt
) -> None:
    lengths = [5, 40, 70, 130, 260]  # > 96 (one chunk) from 130 on
    reqs = [EngineRequest(f"r{i}", prompt(n, 300 + i), greedy(8)) for i, n in enumerate(lengths)]
    engine = Engine.from_checkpoint(tiny_dir, config())
    try:
        got = run_all(engine, reqs)
        stats = engine.stats()
        runner = engine._runner
    finally:
        engine.shutdown()
    assert got == one_rank(tiny64, reqs)
    assert isinstance(runner, TpRunner) and runner.forwards > 0
    assert engine._model.device.type == "meta"  # the engine's process holds no weights
    assert stats.num_free_blocks == stats.num_blocks
    # each rank keeps half the kv heads: the planner's per-rank figure for GQA under TP
    c = tiny64.config
    assert isinstance(c, ModelConfig)
    shape = ModelShape(c.num_hidden_layers, c.num_attention_heads,
                       GQAAttention(c.num_key_value_heads, c.head_dim), "fp32")  # fmt: skip
    per_rank = kv_bytes_per_token(shape, tp=2) * 2  # the engine runs float64
    assert [r.kv_bytes_per_token for r in stats.ranks] == [per_rank] * 2
    assert per_rank * 2 == stats.kv_bytes_per_token
    assert all(rank.sequences == 0 and rank.kv_tokens == 0 for rank in stats.ranks)
    assert isinstance(tiny64.model, LlamaForCausalLM)
    full = weight_bytes(tiny64.model)
    assert all(b < full for b in runner.weight_bytes)


def test_each_tp_rank_holds_its_kv_heads_of_every_token(tiny_dir: Path, prompt: Prompt) -> None:
    engine = Engine.from_checkpoint(tiny_dir, config())
    try:
        engine.add_request(EngineRequest("long", prompt(150, 5), greedy(50)), lambda out: None)
        while engine.stats().num_generation_tokens < 10:  # the 10th is sampled, not yet fed
            engine.step()
        ranks = engine.stats().ranks
    finally:
        engine.shutdown()
    context = 150 + 9
    for rank in ranks:
        assert rank.kv_tokens == context and rank.sequences == 1
        assert rank.kv_bytes == -(-context // BLOCK) * BLOCK * rank.kv_bytes_per_token


def test_a_prefix_hit_and_preemption_on_tp2_give_one_ranks_tokens(
    tiny_dir: Path, tiny64: LoadedModel, prompt: Prompt
) -> None:
    """Both need nothing from the ranks: a cached block id names the same rows in every
    rank's pool, and a preempted request is recomputed into fresh blocks."""
    shared = prompt(160, 7)
    reqs = [
        EngineRequest("a", shared + prompt(8, 8), greedy(6)),
        EngineRequest("b", shared + prompt(8, 9), greedy(6)),
    ]
    engine = Engine.from_checkpoint(tiny_dir, config())
    try:
        first = engine.generate(reqs[0].prompt_token_ids, greedy(6))
        second = engine.generate(reqs[1].prompt_token_ids, greedy(6))
    finally:
        engine.shutdown()
    assert second.num_cached_tokens == 160
    expected = one_rank(tiny64, reqs)
    assert (first.output_token_ids, second.output_token_ids) == (expected["a"], expected["b"])

    crowd = [EngineRequest(f"p{i}", prompt(40, 10 + i), greedy(40)) for i in range(3)]
    small: dict[str, object] = {"num_blocks": 8, "max_model_len": 128}
    engine = Engine.from_checkpoint(tiny_dir, config(TP2, **small))
    try:
        got = run_all(engine, crowd)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert stats.num_preemptions > 0
    assert got == one_rank(tiny64, crowd, **small)


def test_fp8_kv_on_tp2_gives_the_one_rank_fp8_engines_tokens(
    tiny_dir: Path, tiny64: LoadedModel, prompt: Prompt
) -> None:
    """Each rank packs its kv heads' rows as a one-rank fp8 pool packs them (per row and
    head, so the shard's bytes are the whole pool's split by head)."""
    fp8 = {"kv_fp8": Fp8Format(16)}
    reqs = [EngineRequest(f"f{i}", prompt(n, 90 + i), greedy(8)) for i, n in enumerate([9, 120])]
    engine = Engine.from_checkpoint(tiny_dir, config(TP2, **fp8))
    try:
        got = run_all(engine, reqs)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert got == one_rank(tiny64, reqs, **fp8)
    assert [r.kv_bytes_per_token * 2 for r in stats.ranks] == [stats.kv_bytes_per_token] * 2


def test_a_weight_sync_reloads_every_tp_rank(
    tiny_dir: Path, prompt: Prompt, tmp_path: Path
) -> None:
    """A checkpoint whose shapes do not fit is refused before any rank changes."""
    v2 = init_tiny(tmp_path / "v2", seed=1)
    misfit = drop_layer(init_tiny(tmp_path / "misfit", seed=2), 3)
    req = prompt(70, 3)
    engine = Engine.from_checkpoint(tiny_dir, config())
    try:
        v1_tokens = engine.generate(req, greedy(8)).output_token_ids
        assert engine.pause(timeout=30)
        with pytest.raises(CheckpointError, match="missing"):
            engine.load_weights(str(misfit), "bad")
        engine.load_weights(str(v2), "v2")
        engine.resume()
        got = engine.generate(req, greedy(8))
    finally:
        engine.shutdown()
    v2_model = load_model(v2, dtype=torch.float64)
    expected = one_rank(v2_model, [EngineRequest("x", req, greedy(8))])["x"]
    assert got.weights_version == "v2"
    assert got.output_token_ids == expected != v1_tokens


def test_a_push_into_a_tp_worker_reloads_every_rank_from_the_staged_checkpoint(
    tiny_dir: Path, prompt: Prompt, tmp_path: Path
) -> None:
    """The whole model's tensors pushed (as a trainer sends them) into a TP 2 engine: each rank
    takes its shard of the staged push and the engine answers like one rank on those weights."""
    v2 = init_tiny(tmp_path / "v2", seed=1)
    req = prompt(70, 3)
    v1_tokens, got = generate_around_a_push(
        Engine.from_checkpoint(tiny_dir, config()), req, greedy(8), v2
    )
    expected = one_rank(load_model(v2, dtype=torch.float64), [EngineRequest("x", req, greedy(8))])
    assert got.weights_version == "v2"
    assert got.output_token_ids == expected["x"] != v1_tokens


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_keep_swap_on_tp2_gives_the_one_rank_engines_tokens_and_versions(
    tiny_dir: Path, prompt: Prompt, tmp_path: Path, kv: str
) -> None:
    """A push swapped in under a running request (mode keep): the TP 2 engine and the one-rank
    engine, each stepped the same, give the same tokens, each tagged with its version."""
    v2 = init_tiny(tmp_path / "v2", seed=1)
    pushed = load_file(str(v2 / "model.safetensors"))
    req = prompt(40, 3)
    runs = []
    one_rank_engine = Engine(load_model(tiny_dir, dtype=torch.float64), config(ParallelLayout()))
    for engine in (Engine.from_checkpoint(tiny_dir, config()), one_rank_engine):
        try:
            staged = staged_push(engine, pushed, "v2")
            outs: list[RequestOutput] = []
            engine.add_request(EngineRequest("a", req, greedy(16)), outs.append)
            for _ in range(5):
                engine.step()
            engine.load_pushed_keep(staged, kv)
            staged.discard()
            while engine.in_flight():
                engine.step()
        finally:
            engine.shutdown()
        runs.append([(o.weights_version, o.new_token_ids) for o in outs if o.new_token_ids])
    tp2, one = runs
    assert tp2 == one
    assert {v for v, _ in tp2} == {"v1", "v2"} and sum(len(t) for _, t in tp2) == 16


def test_a_tp_rank_that_dies_fails_the_step_with_rank_failure(
    tiny_dir: Path, prompt: Prompt
) -> None:
    engine = Engine.from_checkpoint(tiny_dir, config())
    try:
        engine.add_request(EngineRequest("a", prompt(40, 1), greedy(50)), lambda out: None)
        engine.step()
        assert isinstance(engine._runner, TpRunner)
        os.kill(engine._runner.pids[1], signal.SIGKILL)
        with pytest.raises(RankFailure, match="rank"):
            for _ in range(50):
                engine.step()
    finally:
        engine.shutdown()


def test_settings_tp_cannot_serve_are_refused_before_any_rank_starts(
    tiny_dir: Path, tiny64: LoadedModel, sparse_dir: Path
) -> None:
    with pytest.raises(LayoutError, match=r"tp \(4\) must divide num_attention_heads \(6\)"):
        Engine.from_checkpoint(tiny_dir, config(ParallelLayout(tp=4)))
    with pytest.raises(LayoutError, match="splits over tp only"):
        Engine.from_checkpoint(tiny_dir, config(ParallelLayout(pcp=2)))
    with pytest.raises(LayoutError, match="CPU KV offload on TP ranks"):
        Engine.from_checkpoint(tiny_dir, config(kv_offload_gib=0.01))
    with pytest.raises(LayoutError, match="splits over dcp and dp and ep and pcp only, not tp"):
        Engine.from_checkpoint(sparse_dir, config())
    with pytest.raises(ValueError, match="tp combines with no other split"):
        config(ParallelLayout(tp=2, pcp=2))
    with pytest.raises(LayoutError, match="needs 2 ranks"):
        Engine(tiny64, config())
