"""A live worker under the requests vLLM clients send: vLLM's extension fields are served, fields
no one defines are ignored and named (refused with --strict-fields), and inputs that used to
crash the worker (a seed past 64 bits) or mislead (`messages: [5]`) get a 4xx naming the field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from loom_runtime.wire.headers import IGNORED_FIELDS_HEADER

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1, "--max-body-bytes", str(MAX_BODY)) as w:
        yield w


def _stream(worker: Any, path: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """POST a streamed request; the parsed events (without [DONE])."""

    async def go() -> tuple[int, list[dict[str, Any]]]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(worker.base_url + path, json=body) as resp,
        ):
            events = []
            async for line in resp.content:
                text = line.decode().strip()
                if text.startswith("data: ") and text != "data: [DONE]":
                    events.append(json.loads(text[6:]))
            return resp.status, events

    return asyncio.run(go())


GUIDELLM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


@pytest.mark.parametrize(
    ("path", "prompt"),
    [
        ("/v1/completions", {"prompt": "the quick brown fox"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "the quick fox"}]}),
    ],
)
def test_continuous_usage_stats_put_usage_on_every_chunk(
    worker: Any, path: str, prompt: dict[str, Any]
) -> None:
    """guidellm's default streaming request (finding 1: every one was refused)."""
    body = {"model": worker.model, **prompt, "max_tokens": 6, "max_completion_tokens": 6,
            "stream": True, "stream_options": GUIDELLM_OPTIONS, "ignore_eos": True,
            "stop": None}  # fmt: skip
    status, events = _stream(worker, path, body)
    assert status == 200, events
    assert events and all(isinstance(e.get("usage"), dict) for e in events), events
    completions = [e["usage"]["completion_tokens"] for e in events]
    assert completions == sorted(completions)  # the usage so far, never going back
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6
    assert all(e["usage"]["prompt_tokens"] == events[-1]["usage"]["prompt_tokens"] for e in events)


def test_vllm_sampling_fields_at_their_defaults_are_served(worker: Any) -> None:
    body = {"model": worker.model, "prompt": "hello", "max_tokens": 4, "temperature": 0.7,
            "top_k": 5, "min_p": 0.0, "seed": 2**63 - 1, "min_tokens": 0,
            "repetition_penalty": 1.0, "stop_token_ids": [1], "skip_special_tokens": True,
            "include_stop_str_in_output": False, "spaces_between_special_tokens": False,
            "ignore_eos": True}  # fmt: skip
    code, reply, headers = worker.post("/v1/completions", body)
    assert code == 200, reply
    assert IGNORED_FIELDS_HEADER not in headers
    again = worker.post("/v1/completions", body)[1]
    assert again["choices"][0]["text"] == reply["choices"][0]["text"]  # the seed is used


def test_unknown_fields_are_ignored_and_named_in_a_header(worker: Any) -> None:
    body = {"model": worker.model, "prompt": "hello", "max_tokens": 2, "frobnicate": 1,
            "priority": 3}  # fmt: skip
    code, reply, headers = worker.post("/v1/completions", body)
    assert code == 200, reply
    assert headers[IGNORED_FIELDS_HEADER] == "frobnicate, priority"


def test_strict_fields_worker_refuses_unknown_fields(launch: Any, tiny_v1: Any) -> None:
    with launch(tiny_v1, "--strict-fields") as strict:
        code, reply, _ = strict.post(
            "/v1/completions", {"model": strict.model, "prompt": "hi", "frobnicate": 1}
        )
    assert code == 400
    assert reply["error"]["param"] == "frobnicate"
    assert "unsupported field" in reply["error"]["message"]


COMP = {"model": "tiny-serve", "prompt": "hi"}
CHAT = {"model": "tiny-serve", "messages": [{"role": "user", "content": "hi"}]}
REFUSED = [
    # (path, body, status, param, words in the message)
    ("/v1/completions", {**COMP, "seed": 99999999999999999999999}, 400, "seed", "less than"),
    ("/v1/chat/completions", {**CHAT, "seed": -(2**64)}, 400, "seed", "greater than"),
    ("/v1/chat/completions", {**CHAT, "messages": [5]}, 400, "messages[0]", "object"),
    ("/v1/completions", {**COMP, "prompt": 5}, 400, "prompt", "string or a list"),
    ("/v1/completions", {**COMP, "prompt": [-5]}, 400, "prompt", "non-negative"),
    ("/v1/completions", {**COMP, "prompt": [[1, 2], [3]]}, 400, "prompt", "batched"),
    ("/v1/completions", {**COMP, "min_tokens": 3}, 400, "min_tokens", "not supported"),
    ("/v1/completions", {**COMP, "repetition_penalty": 1.2}, 400, "repetition_penalty",
     "not supported"),
    ("/v1/completions", {**COMP, "min_p": 0.1}, 400, "min_p", "not supported"),
    ("/v1/completions", {**COMP, "skip_special_tokens": False}, 400, "skip_special_tokens",
     "not supported"),
    ("/v1/completions", {**COMP, "include_stop_str_in_output": True}, 400,
     "include_stop_str_in_output", "not supported"),
    ("/v1/completions", b'{"model": "tiny-serve", "prompt": "\xff\xfe"}', 400, None, "UTF-8"),
    ("/v1/completions", {**COMP, "prompt": "x" * (MAX_BODY + 10)}, 413, None, "exceeded"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param", "words"), REFUSED)
def test_bad_input_gets_a_4xx_naming_the_field(
    worker: Any, path: str, body: Any, status: int, param: str | None, words: str
) -> None:
    code, reply, _ = worker.post(path, body)
    assert code == status, reply
    assert set(reply["error"]) == {"message", "type", "param", "code"}
    assert reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["param"] == param
    assert words in reply["error"]["message"]
