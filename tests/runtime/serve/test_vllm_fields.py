"""A live worker under the requests vLLM clients send: vLLM's extension fields are served and take
effect, fields no one defines are ignored and named (refused with --strict-fields), and inputs
that used to crash the worker (a seed past 64 bits) or mislead (`messages: [5]`) get a 4xx
naming the field."""

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


def _greedy(worker: Any, **fields: Any) -> dict[str, Any]:
    """A greedy /v1/completions choice (with its token ids) for a fixed prompt."""
    body = {"model": worker.model, "prompt": "the quick brown fox", "max_tokens": 12,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True, **fields}  # fmt: skip
    code, reply, _ = worker.post("/v1/completions", body)
    assert code == 200, reply
    choice: dict[str, Any] = reply["choices"][0]
    return choice


def test_min_tokens_holds_off_stop_token_ids(worker: Any) -> None:
    ids = _greedy(worker)["token_ids"]
    token = ids[0]
    assert _greedy(worker, stop_token_ids=[token])["token_ids"] == [token]
    held = _greedy(worker, stop_token_ids=[token], min_tokens=4)
    assert token not in held["token_ids"][:4] and len(held["token_ids"]) >= 4


def test_include_stop_str_in_output_keeps_the_stop_string(worker: Any) -> None:
    text = _greedy(worker)["text"]
    stop = text[3:5]
    cut = text.find(stop)
    assert _greedy(worker, stop=[stop])["text"] == text[:cut]
    kept = _greedy(worker, stop=[stop], include_stop_str_in_output=True)
    assert kept["text"] == text[: cut + len(stop)] and kept["finish_reason"] == "stop"


def test_repetition_penalty_and_min_p_change_the_tokens(worker: Any) -> None:
    ids = _greedy(worker)["token_ids"]
    assert len(set(ids)) < len(ids)  # the tiny model repeats itself greedily
    penalized = _greedy(worker, repetition_penalty=1.5)["token_ids"]
    assert len(set(penalized)) == len(penalized)
    # min_p 1 keeps only the top token: a seeded draw at temperature 1 is the greedy answer
    drawn = {"temperature": 1.0, "seed": 5}
    assert _greedy(worker, **drawn)["token_ids"] != ids
    assert _greedy(worker, **drawn, min_p=1.0)["token_ids"] == ids


def test_skip_special_tokens_false_is_served(worker: Any) -> None:
    # The tiny model never writes a special token (the engine test forces one); the text of
    # ordinary tokens is the same either way.
    assert _greedy(worker, skip_special_tokens=False)["text"] == _greedy(worker)["text"]


def test_unknown_fields_are_ignored_and_named_in_a_header(worker: Any) -> None:
    """vLLM's `priority` at 0 asks for nothing (docs/openai-fields.md): neither named nor
    refused; `frobnicate` no schema defines."""
    body = {"model": worker.model, "prompt": "hello", "max_tokens": 2, "frobnicate": 1,
            "priority": 0, "zzz": 2}  # fmt: skip
    code, reply, headers = worker.post("/v1/completions", body)
    assert code == 200, reply
    assert headers[IGNORED_FIELDS_HEADER] == "frobnicate, zzz"


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
    ("/v1/completions", {**COMP, "priority": 3}, 400, "priority", "first come, first served"),
    ("/v1/completions", {**COMP, "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens",
     "min_tokens must be in 0..max_tokens (2)"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens",
     "min_tokens must be in 0..max_tokens (2)"),
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
