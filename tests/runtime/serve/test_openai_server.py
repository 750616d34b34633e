"""A live `loom runtime` worker under the official openai client, bad input and cancellation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

VOCAB_SIZE = 4142  # the tiny checkpoint's vocabulary
MAX_MODEL_LEN = 512
NUM_BLOCKS = 96


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


def test_models_health_and_ready(worker: Any) -> None:
    status, body = worker.get_json("/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == [worker.model]
    assert body["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert worker.get_json("/health")[0] == 200
    assert worker.get_json("/ready")[0] == 200


def test_sync_completion_reports_usage_and_weights_version(
    worker: Any, client: openai.OpenAI
) -> None:
    raw = client.completions.with_raw_response.create(
        model=worker.model, prompt="The quick brown fox", max_tokens=8, temperature=0
    )
    assert raw.headers["x-loom-weights-version"] == "v1"
    done = raw.parse()
    assert done.system_fingerprint == "v1"
    assert done.choices[0].finish_reason == "length"
    assert done.choices[0].text
    assert done.usage is not None
    assert done.usage.completion_tokens == 8
    assert done.usage.total_tokens == done.usage.prompt_tokens + 8
    again = client.completions.create(
        model=worker.model, prompt="The quick brown fox", max_tokens=8, temperature=0
    )
    assert again.choices[0].text == done.choices[0].text  # greedy is deterministic


def test_sync_chat_completion(worker: Any, client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model=worker.model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
    )
    assert done.object == "chat.completion"
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content
    assert done.system_fingerprint == "v1"
    assert done.usage is not None and done.usage.completion_tokens == 6


def test_streamed_text_equals_the_unstreamed_text(worker: Any, client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": worker.model, "max_tokens": 10, "temperature": 0}
    whole = client.completions.create(prompt="Once upon a time", **kwargs)
    chunks = list(
        client.completions.create(
            prompt="Once upon a time",
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert {c.system_fingerprint for c in chunks} == {"v1"}
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_streamed_chat_has_role_then_content(worker: Any, client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Tell me"}]
    kwargs: dict[str, Any] = {"model": worker.model, "max_tokens": 7, "temperature": 0}
    whole = client.chat.completions.create(messages=messages, **kwargs)
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk


def test_logprobs_in_completions_and_chat(worker: Any, client: openai.OpenAI) -> None:
    done = client.completions.create(
        model=worker.model, prompt="Logprobs please", max_tokens=4, temperature=0, logprobs=2
    )
    lp = done.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert lp.text_offset == sorted(lp.text_offset)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 2
        assert chosen == pytest.approx(max(top.values()))  # greedy took the top token
    chat = client.chat.completions.create(
        model=worker.model,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs
    assert content is not None and content.content is not None and len(content.content) == 3
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content.content)


def test_async_client_concurrent_requests_and_streams(worker: Any) -> None:
    async def main() -> tuple[list[Any], list[str]]:
        async with openai.AsyncOpenAI(base_url=worker.api, api_key="x", max_retries=0) as c:
            plain = [
                c.completions.create(model=worker.model, prompt=f"Number {i}", max_tokens=5)
                for i in range(4)
            ]

            async def stream(i: int) -> str:
                s = await c.chat.completions.create(
                    model=worker.model,
                    messages=[{"role": "user", "content": f"Story {i}"}],
                    max_tokens=5,
                    stream=True,
                )
                return "".join([ch.choices[0].delta.content or "" async for ch in s])

            done = await asyncio.gather(*plain)
            streamed = await asyncio.gather(*(stream(i) for i in range(3)))
            return list(done), list(streamed)

    done, streamed = asyncio.run(main())
    assert all(d.usage.completion_tokens == 5 and d.system_fingerprint == "v1" for d in done)
    assert len({d.id for d in done}) == 4
    assert all(s for s in streamed)


def cached_tokens_of_the_same_prompt_twice(worker: Any, client: openai.OpenAI) -> list[int]:
    """The usage's cached tokens of one 200-token prompt (12 full blocks of 16) sent twice."""
    prompt = list(range(100, 300))
    cached = []
    for _ in range(2):
        done = client.completions.create(model=worker.model, prompt=prompt, max_tokens=2)
        assert done.usage is not None and done.usage.prompt_tokens == 200
        assert done.usage.prompt_tokens_details is not None
        cached.append(done.usage.prompt_tokens_details.cached_tokens or 0)
    return cached


def test_same_long_prompt_twice_reports_cached_tokens(worker: Any, client: openai.OpenAI) -> None:
    hits_before = worker.metric("vllm:prefix_cache_hits_total")
    first, cached = cached_tokens_of_the_same_prompt_twice(worker, client)
    assert first == 0
    assert 0 < cached < 200 and cached % 16 == 0
    assert worker.metric("vllm:prefix_cache_hits_total") - hits_before >= cached


def test_a_worker_started_with_no_prefix_caching_caches_nothing(launch: Any, tiny_v1: Any) -> None:
    with launch(tiny_v1, "--no-prefix-caching") as uncached:
        c = openai.OpenAI(base_url=uncached.api, api_key="unused", max_retries=0)
        try:
            assert cached_tokens_of_the_same_prompt_twice(uncached, c) == [0, 0]
        finally:
            c.close()
        assert uncached.metric("vllm:prefix_cache_hits_total") == 0


CHAT = {"model": "tiny-serve", "messages": [{"role": "user", "content": "hi"}]}
COMP = {"model": "tiny-serve", "prompt": "hi"}
LONG_TEXT = "word " * 700  # more tokens than the 512-token context

BAD = [
    # (path, body, status, error type, param)
    ("/v1/completions", b'{"model": "tiny-serve", "prompt": ', 400, "invalid_request_error", None),
    ("/v1/chat/completions", b"not json at all", 400, "invalid_request_error", None),
    ("/v1/completions", {**COMP, "model": "gpt-4"}, 404, "invalid_request_error", "model"),
    ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "invalid_request_error", "model"),
    ("/v1/completions", {**COMP, "prompt": LONG_TEXT}, 400, "invalid_request_error", "prompt"),
    ("/v1/completions", {**COMP, "prompt": [5] * 600}, 400, "invalid_request_error", "prompt"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": LONG_TEXT}]},
     400, "invalid_request_error", "messages"),
    ("/v1/completions", {**COMP, "max_tokens": -1}, 400, "invalid_request_error", "max_tokens"),
    ("/v1/completions", {**COMP, "max_tokens": 10**9}, 400, "invalid_request_error", "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 511}, 400, "invalid_request_error",
     "max_tokens"),
    ("/v1/completions", {**COMP, "temperature": -1}, 400, "invalid_request_error", "temperature"),
    ("/v1/completions", {**COMP, "top_p": 1.5}, 400, "invalid_request_error", "top_p"),
    ("/v1/chat/completions", {**CHAT, "top_k": -7}, 400, "invalid_request_error", "top_k"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "invalid_request_error", "messages"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, 400, "invalid_request_error", "n"),
    ("/v1/completions", {**COMP, "prompt": [VOCAB_SIZE + 5]}, 400, "invalid_request_error",
     "prompt"),
    ("/v1/completions", {"model": "tiny-serve"}, 400, "invalid_request_error", "prompt"),
    ("/v1/completions", {**COMP, "logprobs": 99}, 400, "invalid_request_error", "logprobs"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "kind", "param"), BAD)
def test_bad_input_gets_an_openai_error(
    worker: Any, path: str, body: Any, status: int, kind: str, param: str | None
) -> None:
    code, reply, _ = worker.post(path, body)
    assert code == status
    assert set(reply) == {"error"}
    assert set(reply["error"]) == {"message", "type", "param", "code"}
    assert reply["error"]["type"] == kind
    assert reply["error"]["param"] == param
    assert reply["error"]["message"]


def test_openai_client_raises_typed_errors(worker: Any, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=worker.model, messages=[], max_tokens=1)
    assert info.value.param == "messages"


def test_unknown_route_and_method_are_openai_errors(worker: Any) -> None:
    status, body = worker.get_json("/v1/nothing")
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    status, body = worker.get_json("/v1/completions")  # GET on a POST route
    assert status == 405 and "error" in body


async def _hang_up_after_sending(worker: Any, body: dict[str, Any]) -> asyncio.StreamWriter:
    """Send a non-streaming request on a raw connection; the caller closes it unanswered."""
    host, port = worker.base_url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    writer.write(head.encode() + data)
    await writer.drain()
    return writer


async def _cancelled_burst(worker: Any, streams: int, plain: int) -> None:
    """Open long requests, wait until the engine has them all, then hang up on every one."""
    long_req = {"model": worker.model, "prompt": list(range(50, 250)), "max_tokens": 300,
                "ignore_eos": True}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        opened = []
        for _ in range(streams):
            resp = await session.post(
                f"{worker.api}/completions", json={**long_req, "stream": True}
            )
            assert resp.status == 200
            assert (await resp.content.readline()).startswith(b"data: ")  # tokens are flowing
            opened.append(resp)
        writers = [await _hang_up_after_sending(worker, long_req) for _ in range(plain)]
        while worker.metric("loom:in_flight_requests") < streams + plain:
            await asyncio.sleep(0.05)
        for resp in opened:
            resp.close()  # drop the connection mid-stream
        for writer in writers:
            writer.close()  # drop the connection before the answer
            await writer.wait_closed()


def test_pool_is_whole_after_bad_and_cancelled_requests(worker: Any, wait_until: Any) -> None:
    aborted_before = worker.metric("vllm:request_success_total", finished_reason="abort")
    for path, body, status, _, _ in BAD:
        assert worker.post(path, body)[0] == status
    asyncio.run(_cancelled_burst(worker, streams=3, plain=2))
    for path, body, status, _, _ in BAD[:6]:
        assert worker.post(path, body)[0] == status

    def idle() -> bool:
        m = worker.metrics()
        label = f'{{model_name="{worker.model}"}}'
        return (
            m[f"loom:in_flight_requests{label}"] == 0
            and m[f"vllm:num_requests_running{label}"] == 0
        )

    wait_until(idle, 60, "the cancelled requests to leave the engine")
    assert worker.metric("loom:kv_free_blocks") == NUM_BLOCKS
    assert worker.metric("vllm:kv_cache_usage_perc") == 0.0
    aborted = worker.metric("vllm:request_success_total", finished_reason="abort")
    assert aborted - aborted_before == 5, (aborted, aborted_before)  # each hung-up one aborted
    code, reply, headers = worker.post(  # and the worker still serves
        "/v1/completions", {"model": worker.model, "prompt": "ok", "max_tokens": 3}
    )
    assert code == 200 and reply["usage"]["completion_tokens"] == 3
    assert headers["x-loom-weights-version"] == "v1"
