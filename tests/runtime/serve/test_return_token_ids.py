"""`return_token_ids` (vLLM's extension): the prompt's ids and every output id in the answer, so a
router can replay prompt + output so far on another worker (request migration)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from loom_runtime.serve.responses import Accumulated
from loom_runtime.wire.openai.response import ResponseMeta, chunk

META = ResponseMeta("id-1", 0, "m", "v1")


def test_chunk_places_token_ids_like_vllm() -> None:
    plain = chunk("completion", META.chunk_head("completion"), "a", None, None, False)
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain
    first = chunk(
        "completion", META.chunk_head("completion"), "a", None, None, False, False, (7,), (1, 2)
    )
    assert first["choices"][0]["token_ids"] == [7]
    assert first["choices"][0]["prompt_token_ids"] == [1, 2]
    chat = chunk("chat", META.chunk_head("chat"), "", None, None, False, True, None, (1, 2))
    assert chat["prompt_token_ids"] == [1, 2] and "token_ids" not in chat["choices"][0]


def test_full_body_lists_every_output_id_only_when_asked() -> None:
    acc = Accumulated()
    acc.token_ids.extend([5, 6, 7])
    assert "token_ids" not in acc.body("completion", META, None)["choices"][0]
    body = acc.body("chat", META, None, (1, 2, 3))
    assert body["choices"][0]["token_ids"] == [5, 6, 7]
    assert body["prompt_token_ids"] == [1, 2, 3]


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


def _stream(worker: Any, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    req = urllib.request.Request(
        worker.base_url + path, data=json.dumps({**body, "stream": True}).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    events = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_streamed_ids_replayed_as_a_prompt_continue_the_same_greedy_output(worker: Any) -> None:
    body = {"model": worker.model, "prompt": "Once upon a time", "max_tokens": 12,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    events = _stream(worker, "/v1/completions", body)
    prompt_ids = events[0]["choices"][0]["prompt_token_ids"]
    assert all("prompt_token_ids" not in e["choices"][0] for e in events[1:])
    ids = [t for e in events for t in e["choices"][0]["token_ids"]]
    assert len(ids) == 12  # every token reported, even one whose text is still incomplete
    assert all(len(e["choices"][0]["token_ids"]) <= 1 for e in events)
    status, whole, _ = worker.post("/v1/completions", {**body, "return_token_ids": True})
    assert status == 200
    assert whole["choices"][0]["prompt_token_ids"] == prompt_ids
    assert whole["choices"][0]["token_ids"] == ids
    # Replaying prompt + the first 5 output ids continues with exactly the remaining 7.
    replay = {**body, "prompt": prompt_ids + ids[:5], "max_tokens": 7}
    status, rest, _ = worker.post("/v1/completions", replay)
    assert status == 200 and rest["choices"][0]["token_ids"] == ids[5:]
    status, without, _ = worker.post("/v1/completions", {**body, "return_token_ids": False})
    assert "token_ids" not in without["choices"][0]


def test_chat_stream_puts_prompt_ids_on_the_role_chunk(worker: Any) -> None:
    body = {"model": worker.model, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    events = _stream(worker, "/v1/chat/completions", body)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[0]["prompt_token_ids"] and "prompt_token_ids" not in events[1]
    ids = [t for e in events for t in e["choices"][0].get("token_ids", [])]
    status, whole, _ = worker.post("/v1/chat/completions", {**body})
    assert status == 200 and whole["choices"][0]["token_ids"] == ids and len(ids) == 4
    assert whole["prompt_token_ids"] == events[0]["prompt_token_ids"]
