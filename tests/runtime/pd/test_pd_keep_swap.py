"""A keep swap (push mode keep) on P/D engines, in one process over real TCP connectors, float64,
greedy. A decode that swapped v1 → v2 under its requests treats prompt KV of v1 (a prefill that
has not swapped yet, or a pull in flight at the swap) by the swap's kv policy: "recompute"
prefills the prompt locally (exactly the new weights' aggregated tokens), "keep" uses the pulled
KV (never prefix-cached); KV of a version it never swapped from is refused as before. A prefill
that swaps keeps its leases pullable, stamped with the version they were computed on."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.runtime.engine.push_helpers import staged_push
from tests.runtime.pd.engine_workers import Workers, run, wait_for, whole

from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, RequestOutput, SamplingParams
from loom_runtime.models.loader import load_model
from loom_runtime.models.tiny import init_tiny
from loom_runtime.wire.kv_transfer import KVTransferParams

MAX_TOKENS = 6
PULLED = 149  # a 150-token prompt: all but its last token come from the prefill


@pytest.fixture(scope="module")
def new_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("pd-keep-new"), seed=1)


@pytest.fixture(scope="module")
def new_weights(new_checkpoint: Path) -> Mapping[str, torch.Tensor]:
    return load_file(str(new_checkpoint / "model.safetensors"))


@pytest.fixture
def workers(tiny_workers: Workers) -> Workers:
    return tiny_workers  # tiny llama engines (conftest.py), not the sparse-mla default


def prompt(seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(int(t) for t in torch.randint(10, 4000, (150,), generator=gen))


def aggregated_tokens(checkpoint: Path, tokens: tuple[int, ...]) -> tuple[int, ...]:
    """The greedy tokens of an aggregated engine on `checkpoint`'s weights."""
    config = EngineConfig(dtype=torch.float64, max_model_len=1024, num_blocks=128)
    engine = Engine(load_model(checkpoint, dtype=torch.float64), config)
    try:
        return tuple(engine.generate(tokens, greedy()).output_token_ids)
    finally:
        engine.shutdown()


def greedy() -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


def own_engine(workers: Workers, checkpoint: Path, role: str, start: bool = True) -> Engine:
    """A P/D engine on its own copy of `checkpoint` (a swap changes only its weights)."""
    model = load_model(checkpoint, dtype=torch.float64)
    engine, _ = workers.engine(role, model=model, start=start)
    return engine


def keep_swap(engine: Engine, weights: Mapping[str, torch.Tensor], kv: str) -> None:
    engine.load_pushed_keep(staged_push(engine, weights, "v2"), kv)
    assert engine.weights_version == "v2"


def leased(prefill: Engine, rid: str, tokens: tuple[int, ...]) -> KVTransferParams:
    answer = run(prefill, rid, tokens, 1, KVTransferParams.for_prefill()).outputs[-1]
    assert isinstance(answer.kv_transfer_params, KVTransferParams)
    return answer.kv_transfer_params


def versions(outs: list[RequestOutput]) -> set[str]:
    return {o.weights_version for o in outs if o.new_token_ids}


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_kv_of_the_version_a_decode_keep_swapped_from_follows_the_kv_policy(
    workers: Workers,
    tiny_checkpoint: Path,
    new_checkpoint: Path,
    new_weights: Mapping[str, torch.Tensor],
    kv: str,
) -> None:
    prefill, _ = workers.engine("prefill")  # not swapped: its leases are of v1
    decode = own_engine(workers, tiny_checkpoint, "decode")
    tokens = prompt(seed=7)
    keep_swap(decode, new_weights, kv)
    params = leased(prefill, "p", tokens)
    assert params.weights_version == "v1"
    done = run(decode, "d", tokens, MAX_TOKENS, params)
    got = done.result().output_token_ids
    assert len(got) == MAX_TOKENS and versions(done.outputs) == {"v2"}
    stats = decode.stats()
    assert stats.kv_transfer_failures == 0  # a keep swap's KV is no transfer failure
    redone = aggregated_tokens(new_checkpoint, tokens)
    if kv == "recompute":
        assert tuple(got) == redone and stats.kv_pulled_tokens == 0
    else:
        assert stats.kv_pulled_tokens == PULLED
        assert tuple(got) != redone  # the v1 KV changed what the v2 weights drew
    again = run(decode, "again", tokens, MAX_TOKENS).result()  # the same prompt, locally
    assert again.num_cached_tokens == (0 if kv == "keep" else 144)  # v1 KV was never cached
    assert tuple(again.output_token_ids) == redone
    wait_for(lambda: whole(prefill), "the prefill's lease to be released")
    wait_for(lambda: whole(decode), "the decode's pool to be whole")


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_pull_in_flight_at_a_keep_swap_follows_the_kv_policy(
    workers: Workers,
    tiny_checkpoint: Path,
    new_checkpoint: Path,
    new_weights: Mapping[str, torch.Tensor],
    kv: str,
) -> None:
    """The decode is stepped here: one step starts the pull, the swap lands before the next."""
    prefill, _ = workers.engine("prefill")
    decode = own_engine(workers, tiny_checkpoint, "decode", start=False)
    tokens = prompt(seed=8)
    params = leased(prefill, "p", tokens)
    req = EngineRequest("d", tokens, greedy(), kv_transfer=params)
    collector = OutputCollector(req)
    decode.add_request(req, collector)
    decode.step()
    assert decode.stats().num_kv_pulls == 1  # pulling, not yet landed
    keep_swap(decode, new_weights, kv)
    assert collector.wait(time.monotonic() + 60, decode.step)
    got = tuple(collector.result().output_token_ids)
    assert len(got) == MAX_TOKENS and versions(collector.outputs) == {"v2"}
    redone = aggregated_tokens(new_checkpoint, tokens)
    stats = decode.stats()
    assert stats.kv_transfer_failures == 0
    if kv == "recompute":
        assert got == redone and stats.kv_pulled_tokens == 0  # pulled, then dropped unused
    else:
        assert got != redone and stats.kv_pulled_tokens == PULLED
    wait_for(lambda: whole(prefill), "the prefill's lease to be released")
    assert whole(decode)


def test_kv_of_a_version_the_decode_never_swapped_from_is_still_refused(
    workers: Workers, tiny_checkpoint: Path, new_weights: Mapping[str, torch.Tensor]
) -> None:
    """Nor, after a drained load, of one it keep-swapped from before that load."""
    prefill, _ = workers.engine("prefill")
    decode = own_engine(workers, tiny_checkpoint, "decode")  # transfer failures: recompute
    keep_swap(decode, new_weights, "keep")
    tokens = prompt(seed=9)
    params = replace(leased(prefill, "p", tokens), weights_version="v0")
    run(decode, "d", tokens, MAX_TOKENS, params)
    assert decode.stats().kv_pulled_tokens == 0 and decode.stats().kv_transfer_failures == 1
    staged = staged_push(decode, new_weights, "v3")
    assert decode.pause(timeout=30)
    decode.load_pushed(staged)  # drained: v1 (swapped from in keep) is no longer taken
    decode.resume()
    run(decode, "d2", tokens, MAX_TOKENS, leased(prefill, "p2", tokens))  # leased as v1
    assert decode.stats().kv_pulled_tokens == 0 and decode.stats().kv_transfer_failures == 2
    wait_for(lambda: whole(prefill), "the refused leases to be released")


def test_a_prefill_that_keep_swaps_keeps_its_leases_and_stamps_new_ones_v2(
    workers: Workers,
    tiny_checkpoint: Path,
    new_checkpoint: Path,
    new_weights: Mapping[str, torch.Tensor],
) -> None:
    prefill = own_engine(workers, tiny_checkpoint, "prefill")
    old_decode, _ = workers.engine("decode")  # v1, on the shared model
    tokens = prompt(seed=10)
    before = leased(prefill, "p1", tokens)  # leased under v1, pulled after the swap
    keep_swap(prefill, new_weights, "keep")
    assert prefill.stats().num_kv_leases == 1
    out = run(old_decode, "d1", tokens, MAX_TOKENS, before).result()
    assert tuple(out.output_token_ids) == aggregated_tokens(tiny_checkpoint, tokens)
    assert old_decode.stats().kv_pulled_tokens == PULLED
    after = leased(prefill, "p2", tokens)
    assert after.weights_version == "v2"
    new_decode = own_engine(workers, new_checkpoint, "decode")  # serves new weights as "v1"
    new_decode.load_pushed_keep(staged_push(new_decode, new_weights, "v2"), "keep")
    out = run(new_decode, "d2", tokens, MAX_TOKENS, after).result()
    assert tuple(out.output_token_ids) == aggregated_tokens(new_checkpoint, tokens)
    assert new_decode.stats().kv_pulled_tokens == PULLED
    wait_for(lambda: whole(prefill), "both leases to be released")
