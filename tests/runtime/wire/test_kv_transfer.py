"""kv_transfer_params: vLLM NixlConnector's object read and written exactly, bad input refused
with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.kv_transfer import KVTransferParams

# What vLLM's NixlConnector (v2) answers after a prefill (request_finished).
VLLM_PREFILL_ANSWER: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [4, 9, 11],
    "remote_engine_id": "engine-0",
    "remote_request_id": "cmpl-abc",
    "remote_host": "10.0.0.3",
    "remote_port": 5600,
    "tp_size": 1,
}


def test_the_proxys_prefill_request_is_vllms_shape() -> None:
    assert KVTransferParams.for_prefill().to_dict() == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_request_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
        "tp_size": 1,
    }
    parsed = KVTransferParams.parse(KVTransferParams.for_prefill().to_dict())
    assert parsed.do_remote_decode and not parsed.do_remote_prefill and parsed.is_transfer


def test_a_vllm_prefill_answer_parses_and_round_trips() -> None:
    params = KVTransferParams.parse({**VLLM_PREFILL_ANSWER, "future_field": [1, 2]})
    assert params.do_remote_prefill and params.remote_block_ids == (4, 9, 11)
    assert (params.remote_host, params.remote_port) == ("10.0.0.3", 5600)
    assert params.remote_num_tokens is None  # a vLLM prefill does not send Loom's extensions
    assert params.to_dict() == VLLM_PREFILL_ANSWER  # unknown keys dropped, nothing invented


def test_loom_extensions_round_trip() -> None:
    raw = {
        **VLLM_PREFILL_ANSWER,
        "remote_num_tokens": 40,
        "weights_version": "v3",
        "lease_seconds": 30.0,
    }
    params = KVTransferParams.parse(raw)
    assert (params.remote_num_tokens, params.weights_version, params.lease_seconds) == (
        40,
        "v3",
        30.0,
    )
    assert KVTransferParams.parse(params.to_dict()) == params


def test_all_false_or_null_means_no_transfer() -> None:
    assert not KVTransferParams.parse({}).is_transfer
    assert not KVTransferParams.parse({"do_remote_decode": None, "remote_host": None}).is_transfer


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ([], "kv_transfer_params"),
        ({"do_remote_decode": "yes"}, "kv_transfer_params.do_remote_decode"),
        (
            {**VLLM_PREFILL_ANSWER, "remote_block_ids": [1, -2]},
            "kv_transfer_params.remote_block_ids",
        ),
        (
            {**VLLM_PREFILL_ANSWER, "remote_block_ids": [1, True]},
            "kv_transfer_params.remote_block_ids",
        ),
        ({**VLLM_PREFILL_ANSWER, "remote_port": 70000}, "kv_transfer_params.remote_port"),
        ({**VLLM_PREFILL_ANSWER, "remote_host": ""}, "kv_transfer_params.remote_host"),
        ({**VLLM_PREFILL_ANSWER, "remote_host": None}, "kv_transfer_params.remote_host"),
        (
            {**VLLM_PREFILL_ANSWER, "remote_request_id": None},
            "kv_transfer_params.remote_request_id",
        ),
        ({**VLLM_PREFILL_ANSWER, "do_remote_decode": True}, "kv_transfer_params"),
        ({**VLLM_PREFILL_ANSWER, "lease_seconds": "30"}, "kv_transfer_params.lease_seconds"),
    ],
)
def test_bad_params_name_the_field(raw: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        KVTransferParams.parse(raw)
    assert info.value.param == param
