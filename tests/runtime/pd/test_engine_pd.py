"""P/D inside one process: a prefill Engine and a decode Engine joined by real TCP connectors.

Covers the engine's side of the contract: role checks, the lease answer, the first-token rule,
the transfer-failure policies (recompute gives the aggregated tokens, fail gives a clear error),
lease expiry, and pool accounting after each.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from tests.runtime.pd.engine_workers import Workers, run, wait_for, whole

from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.errors import InvalidRequestError
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.wire.kv_transfer import KVTransferParams

MAX_TOKENS = 6


def prompt(n: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(int(t) for t in torch.randint(10, 4000, (n,), generator=gen))


@pytest.fixture
def workers(tiny_workers: Workers) -> Workers:
    return tiny_workers  # tiny llama engines (conftest.py), not the sparse-mla default


def test_prefill_answers_a_lease_and_decode_continues_with_the_aggregated_tokens(
    workers: Workers,
) -> None:
    aggregated, _ = workers.engine()
    prefill, _ = workers.engine("prefill", block_size=32)
    decode, _ = workers.engine("decode", block_size=16)
    tokens = prompt(300, seed=1)
    expected = run(aggregated, "a", tokens, MAX_TOKENS).result().output_token_ids
    pre = run(prefill, "p", tokens, 1, KVTransferParams.for_prefill())
    final = pre.outputs[-1]
    assert final.finish_reason == "length" and final.kv_transfer_params is not None
    answer = KVTransferParams.parse(final.kv_transfer_params.to_dict())
    assert answer.do_remote_prefill and answer.remote_request_id == "p"
    assert answer.remote_block_ids is not None and len(answer.remote_block_ids) == 10  # 300 / 32
    assert answer.remote_num_tokens == 300 and answer.weights_version == "v1"
    assert prefill.stats().num_kv_leases == 1  # pinned until the decode pulls
    used_before = prefill.stats().num_blocks - prefill.stats().num_free_blocks
    assert used_before == 10
    out = run(decode, "d", tokens, MAX_TOKENS, answer).result()
    assert out.output_token_ids == expected  # first token included
    assert decode.stats().kv_pulled_tokens == 299  # all but the last prompt token
    pulled = decode.stats().kv_pulled_bytes  # the same bytes for each of those tokens
    assert pulled > 0 and pulled % 299 == 0
    assert decode.stats().num_tokens_computed == MAX_TOKENS  # last prompt token + 5 decodes
    wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")
    wait_for(lambda: whole(decode), "the decode's pool to be whole")
    assert prefill.stats().kv_expired == 0


def test_pd_with_fp8_kv_gives_the_aggregated_fp8_tokens(workers: Workers) -> None:
    """The packed fp8 rows (e4m3 values + fp32 scales) move as they are, across block sizes:
    the decode attends over the very bytes an aggregated fp8 worker would have written."""
    fp8 = Fp8Format(128)
    aggregated, _ = workers.engine(kv_fp8=fp8)
    prefill, _ = workers.engine("prefill", block_size=32, kv_fp8=fp8)
    decode, _ = workers.engine("decode", block_size=16, kv_fp8=fp8)
    tokens = prompt(300, seed=3)
    expected = run(aggregated, "a", tokens, MAX_TOKENS).result().output_token_ids
    answer = run(prefill, "p", tokens, 1, KVTransferParams.for_prefill()).outputs[-1]
    assert answer.kv_transfer_params is not None
    params = KVTransferParams.parse(answer.kv_transfer_params.to_dict())
    out = run(decode, "d", tokens, MAX_TOKENS, params).result()
    assert out.output_token_ids == expected
    per_token = decode.stats().kv_bytes_per_token
    assert per_token == 6 * 2 * 2 * (64 + 4)  # tiny llama: e4m3 head rows + one scale each
    assert decode.stats().kv_pulled_bytes == 299 * per_token
    assert decode.stats().num_tokens_computed == MAX_TOKENS
    wait_for(lambda: whole(prefill), "the prefill to free the pulled lease")


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_pull_from_a_dead_prefill_follows_the_policy(workers: Workers, policy: str) -> None:
    aggregated, _ = workers.engine()
    prefill, p_conn = workers.engine("prefill")
    decode, _ = workers.engine("decode", policy=policy)
    tokens = prompt(200, seed=2)
    answer = run(prefill, "p", tokens, 1, KVTransferParams.for_prefill()).outputs[-1]
    assert answer.kv_transfer_params is not None
    prefill.shutdown()
    assert p_conn is not None
    p_conn.close()  # the prefill is gone between prefill and pull
    result = run(decode, "d", tokens, MAX_TOKENS, answer.kv_transfer_params)
    final = result.outputs[-1]
    if policy == "recompute":
        expected = run(aggregated, "a", tokens, MAX_TOKENS).result().output_token_ids
        assert result.result().output_token_ids == expected
        assert final.transfer_error is None
    else:
        assert final.finish_reason == "abort" and not result.result().output_token_ids
        assert final.transfer_error is not None and "cannot reach" in final.transfer_error
    assert decode.stats().kv_transfer_failures == 1
    wait_for(lambda: whole(decode), "the decode's pool to be whole")


def test_a_lease_nobody_pulls_expires_frees_its_blocks_and_is_counted(workers: Workers) -> None:
    prefill, _ = workers.engine("prefill", lease_s=0.2)
    run(prefill, "p", prompt(100, seed=3), 1, KVTransferParams.for_prefill())
    wait_for(lambda: whole(prefill), "the expired lease to be freed")
    assert prefill.stats().kv_expired == 1


def test_kv_of_another_prompt_or_weights_version_is_never_used(workers: Workers) -> None:
    aggregated, _ = workers.engine()
    prefill, _ = workers.engine("prefill")
    decode, _ = workers.engine("decode")
    tokens = prompt(150, seed=4)
    answer = run(prefill, "p", tokens, 1, KVTransferParams.for_prefill()).outputs[-1]
    params = answer.kv_transfer_params
    assert isinstance(params, KVTransferParams)
    expected = run(aggregated, "a", tokens, MAX_TOKENS).result().output_token_ids
    other_version = replace(params, weights_version="v0")
    out = run(decode, "d1", tokens, MAX_TOKENS, other_version).result()
    assert out.output_token_ids == expected  # recomputed locally, not pulled
    assert decode.stats().kv_pulled_tokens == 0 and decode.stats().kv_transfer_failures == 1
    longer = (*tokens, 99)
    run(decode, "d2", longer, MAX_TOKENS, params)
    assert decode.stats().kv_pulled_tokens == 0 and decode.stats().kv_transfer_failures == 2
    wait_for(lambda: whole(prefill), "the prefill lease to be released by the refusals")
    assert prefill.stats().kv_expired == 0


def test_requests_must_match_the_workers_role(workers: Workers) -> None:
    aggregated, _ = workers.engine()
    decode, _ = workers.engine("decode")
    prefill, _ = workers.engine("prefill")
    tokens = prompt(20, seed=5)
    to_prefill = KVTransferParams.for_prefill()
    from_prefill = KVTransferParams(
        do_remote_prefill=True,
        remote_engine_id="e",
        remote_request_id="r",
        remote_block_ids=(1,),
        remote_host="127.0.0.1",
        remote_port=9,
    )
    cases = [
        (aggregated, to_prefill, "prefill", "aggregated"),
        (decode, to_prefill, "prefill", "decode"),
        (prefill, from_prefill, "decode", "prefill"),
    ]
    for engine, params, wanted, role in cases:
        req = EngineRequest("x", tokens, SamplingParams(max_tokens=1), kv_transfer=params)
        with pytest.raises(InvalidRequestError, match=f"needs a {wanted} worker") as info:
            engine.add_request(req, lambda _: None)
        assert f"--role {role}" in str(info.value)


def test_aborting_a_request_that_waits_for_blocks_releases_the_remote_lease(
    workers: Workers,
) -> None:
    prefill, _ = workers.engine("prefill")
    decode, _ = workers.engine("decode", num_blocks=80)
    tokens = prompt(900, seed=6)
    answer = run(prefill, "p", tokens, 1, KVTransferParams.for_prefill()).outputs[-1]
    # Hold 64 of the decode's 80 blocks so the remote request (57 blocks) waits for blocks.
    greedy = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    hog = EngineRequest("hog", prompt(1000, seed=7), greedy)
    hog_out = OutputCollector(hog)
    decode.add_request(hog, hog_out)
    wait_for(lambda: decode.stats().num_running == 1, "the hog to run")
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    req = EngineRequest("d", tokens, sampling, kv_transfer=answer.kv_transfer_params)
    waiting = OutputCollector(req)
    decode.add_request(req, waiting)
    wait_for(lambda: decode.stats().num_kv_pulls == 1, "the remote request to wait for blocks")
    decode.abort("d")
    assert waiting.wait(time.monotonic() + 60)
    assert waiting.outputs[-1].finish_reason == "abort"
    wait_for(lambda: whole(prefill), "the prefill lease to be released by the abort")
    assert prefill.stats().kv_expired == 0
    assert hog_out.wait(time.monotonic() + 120)
    wait_for(lambda: whole(decode), "the decode's pool to be whole")


def test_a_decode_with_kv_offload_reloads_its_local_prefix_and_pulls_the_rest(
    workers: Workers,
) -> None:
    """A decode's own prefix cache spills into its host tier; a later pull of the same prompt
    reloads that prefix and pulls only what follows, with the aggregated tokens."""
    aggregated, _ = workers.engine()
    prefill, _ = workers.engine("prefill")
    decode, _ = workers.engine("decode", num_blocks=64, kv_offload_gib=0.05)
    first, other = prompt(300, seed=5), prompt(900, seed=6)

    def pd(rid: str, tokens: tuple[int, ...]) -> CompletedRequest:
        answer = run(prefill, f"{rid}-p", tokens, 1, KVTransferParams.for_prefill())
        params = answer.outputs[-1].kv_transfer_params
        assert params is not None
        return run(
            decode, rid, tokens, MAX_TOKENS, KVTransferParams.parse(params.to_dict())
        ).result()

    expected = run(aggregated, "a", first, MAX_TOKENS).result().output_token_ids
    assert pd("d1", first).output_token_ids == expected
    pd("d2", other)  # fills the decode's 64 blocks: most of first's go to the host tier
    pulled_before = decode.stats().kv_pulled_tokens
    again = pd("d3", first)
    assert again.output_token_ids == expected
    reloaded = decode.stats().kv_reload_tokens
    assert 0 < reloaded <= again.num_cached_tokens
    assert decode.stats().kv_pulled_tokens - pulled_before == 299 - again.num_cached_tokens
    wait_for(lambda: whole(decode), "the decode's pool to be whole")
