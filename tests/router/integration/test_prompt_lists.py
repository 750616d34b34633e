"""A list of prompts in /v1/completions through the router: one choice per prompt with `index`
in order, whole and streamed, equal to the worker's own answer; the first prompt routes it."""

from __future__ import annotations

from typing import Any

import openai

from loom_runtime.testing.processes import post

MODEL = "tiny-router"
PROMPTS: list[Any] = ["Once upon a time", [21, 22, 23, 24], "The quick brown fox"]


def body(**more: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPTS, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, **more}  # fmt: skip


def test_a_list_of_prompts_through_the_router_is_the_workers_answer(
    router: Any, worker: Any
) -> None:
    status, want, _ = post(worker.url + "/v1/completions", body())
    assert status == 200, want
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    try:
        done = client.completions.create(
            model=MODEL,
            prompt=PROMPTS,
            max_tokens=4,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
    finally:
        client.close()
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert [c.text for c in done.choices] == [c["text"] for c in want["choices"]]
    assert done.usage is not None and done.usage.completion_tokens == 12


def streamed(router: Any, request: dict[str, Any], choices: int) -> tuple[list[str], Any]:
    """Each choice's text, by index, and the usage of a streamed request through the router."""
    stream = router.stream("/v1/completions", request)
    texts, usage = [""] * choices, None
    for event in stream.events():
        for choice in event["choices"]:
            texts[choice["index"]] += choice["text"]
        usage = event.get("usage") or usage
    stream.close()
    assert stream.status == 200
    return texts, usage


def test_a_streamed_list_of_prompts_keeps_each_choice_under_its_index(
    router: Any, worker: Any
) -> None:
    want = post(worker.url + "/v1/completions", body())[1]
    texts, usage = streamed(router, body(stream_options={"include_usage": True}), 3)
    assert texts == [c["text"] for c in want["choices"]]
    assert usage is not None and usage["completion_tokens"] == 12


def test_a_streamed_request_for_n_choices_keeps_each_under_its_index(
    router: Any, worker: Any
) -> None:
    asks = {"n": 2, "seed": 3, "temperature": 1.0}
    want = post(worker.url + "/v1/completions", body(**asks))[1]
    texts, usage = streamed(router, body(**asks, stream_options={"include_usage": True}), 6)
    assert texts == [c["text"] for c in want["choices"]]
    assert usage is not None and usage["completion_tokens"] == 24
