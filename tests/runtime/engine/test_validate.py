"""Requests the engine must refuse with a 400 naming the parameter, before queueing anything."""

from __future__ import annotations

import pytest

from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.engine.validate import validate_request
from loom_runtime.errors import InvalidRequestError

MAX_LEN, VOCAB = 64, 100


def req(prompt: tuple[int, ...] = (1, 2, 3), rid: str = "r", **sampling: object) -> EngineRequest:
    return EngineRequest(rid, prompt, SamplingParams(**sampling))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (req(()), "prompt"),
        (req(tuple(range(1, 65)), max_tokens=1), "prompt"),
        (req((1, 100)), "prompt"),
        (req((1, -1)), "prompt"),
        (req(max_tokens=0), "max_tokens"),
        (req(max_tokens=62), "max_tokens"),
        (req(temperature=-0.1), "temperature"),
        (req(temperature=float("nan")), "temperature"),
        (req(top_p=0.0), "top_p"),
        (req(top_p=1.5), "top_p"),
        (req(top_k=-1), "top_k"),
        (req(logprobs=21), "logprobs"),
        (req(logprobs=-1), "logprobs"),
        (req(stop=("",)), "stop"),
        (req(min_p=1.5), "min_p"),
        (req(min_p=float("nan")), "min_p"),
        (req(repetition_penalty=0.0), "repetition_penalty"),
        (req(repetition_penalty=float("inf")), "repetition_penalty"),
        (req(min_tokens=-1), "min_tokens"),
        (req(max_tokens=4, min_tokens=5), "min_tokens"),
        (req(logit_bias=((VOCAB, 1.0),)), "logit_bias"),
        (req(rid=""), "request_id"),
    ],
)
def test_invalid_requests_name_their_parameter(request_: EngineRequest, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        validate_request(request_, MAX_LEN, VOCAB)
    assert err.value.param == param


def test_a_request_at_the_limits_is_accepted() -> None:
    validate_request(req(tuple(range(63)), max_tokens=1), MAX_LEN, VOCAB)
    validate_request(req((99,), max_tokens=63, top_p=1.0, logprobs=20, temperature=0.0), 64, 100)
    validate_request(req(max_tokens=4, min_tokens=4, min_p=1.0, repetition_penalty=0.01), 64, 100)
