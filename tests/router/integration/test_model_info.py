"""The router's answers about the model (shell/model_info.py) against real workers: /v1/models
lists the fleet's max_model_len as vLLM does, /tokenize and /detokenize are a worker's answers,
and the request fields of issue #36's first slice pass through (openai SDK)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from loom_runtime.testing.processes import post

MODEL = "tiny-router"
MAX_MODEL_LEN = 2048  # the integration workers' --max-model-len


def test_models_lists_the_fleets_max_model_len(router: Any) -> None:
    status, models, _ = router.get("/v1/models")
    assert status == 200 and models["data"][0]["id"] == MODEL
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"model": MODEL, "prompt": "hello world", "return_token_strs": True}),
        ("/tokenize", {"messages": [{"role": "developer", "content": "hi"}]}),
        ("/detokenize", {"tokens": [5, 6, 7]}),
        ("/detokenize", {"tokens": [10**6]}),
    ],
)
def test_tokenize_and_detokenize_are_the_workers_answers(
    router: Any, worker: Any, path: str, body: dict[str, Any]
) -> None:
    want_status, want, _ = post(worker.url + path, body)
    status, got, headers = router.post(path, body, {"x-request-id": "tok-1"})
    assert (status, got) == (want_status, want)
    assert headers["x-request-id"] == "tok-1"


def test_logit_bias_and_a_refused_field_through_the_router(router: Any) -> None:
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    try:
        done = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0,
            logit_bias={"42": 100}, extra_body={"return_token_ids": True},
        )  # fmt: skip
        assert list(done.choices[0].token_ids) == [42] * 4  # type: ignore[attr-defined]
        stream = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0,
            logit_bias={"42": 100}, stream=True,
        )  # fmt: skip
        assert "".join(c.choices[0].text for c in stream) == done.choices[0].text
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=MODEL, prompt="x", presence_penalty=0.5)
        assert err.value.body["param"] == "presence_penalty"  # type: ignore[index]
    finally:
        client.close()
