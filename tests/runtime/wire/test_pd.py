"""The P/D two-step's request rewrites (the router's and the test proxy's): exactly vLLM's
contract (docs/pd.md)."""

from __future__ import annotations

from typing import Any

from loom_runtime.wire.kv_transfer import KVTransferParams
from loom_runtime.wire.pd import decode_body, prefill_body

CLIENT: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 50,
    "max_completion_tokens": 40,
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0,
}


def test_the_prefill_step_is_a_one_token_unstreamed_remote_decode_request() -> None:
    body = prefill_body(CLIENT)
    # vLLM's shape, pinned in test_kv_transfer.py
    assert body["kv_transfer_params"] == KVTransferParams.for_prefill().to_dict()
    assert (body["stream"], body["max_tokens"], body["max_completion_tokens"]) == (False, 1, 1)
    assert "stream_options" not in body
    assert body["messages"] == CLIENT["messages"] and body["temperature"] == 0
    assert CLIENT["max_tokens"] == 50 and CLIENT["stream"] is True  # the original is untouched


def test_the_decode_step_is_the_original_request_plus_the_prefills_params() -> None:
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_engine_id": "e"}
    body = decode_body(CLIENT, params)
    assert body == {**CLIENT, "kv_transfer_params": params}


def test_without_params_from_the_prefill_the_decode_prefills_locally() -> None:
    assert decode_body(CLIENT, None) == CLIENT
    assert decode_body(CLIENT, {}) == CLIENT
    smuggled = {**CLIENT, "kv_transfer_params": {"do_remote_prefill": True}}
    assert "kv_transfer_params" not in decode_body(smuggled, None)


def test_prefill_body_never_asks_token_ids() -> None:
    assert "return_token_ids" not in prefill_body({"model": "m", "return_token_ids": True})


def test_prefill_body_keeps_min_tokens_within_its_one_token() -> None:
    assert prefill_body({**CLIENT, "min_tokens": 30})["min_tokens"] == 1
    assert prefill_body({**CLIENT, "min_tokens": 1})["min_tokens"] == 1
    assert "min_tokens" not in prefill_body(CLIENT)
    # a value the decode would refuse reaches the prefill unchanged, so it refuses it too
    assert prefill_body({**CLIENT, "min_tokens": -3})["min_tokens"] == -3
    assert prefill_body({**CLIENT, "min_tokens": "9"})["min_tokens"] == "9"
