"""Response and chunk encoding: one shape for the worker and the router, key order included."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loom_runtime.wire.openai.response import (
    HEAD_FIELDS,
    ResponseMeta,
    body_object,
    chunk,
    chunk_object,
    full_body,
    usage_chunk,
)

META = ResponseMeta("id-1", 7, "m", "v3")
USAGE = {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}


def test_head_repeats_id_created_model_and_version_as_fingerprint_in_order() -> None:
    head = META.head("x")
    assert tuple(head) == HEAD_FIELDS
    assert head == {"id": "id-1", "object": "x", "created": 7, "model": "m",
                    "system_fingerprint": "v3"}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "chunk_obj", "body_obj"),
    [("chat", "chat.completion.chunk", "chat.completion"),
     ("completion", "text_completion", "text_completion")],
)  # fmt: skip
def test_objects_by_kind(kind: Any, chunk_obj: str, body_obj: str) -> None:
    assert chunk_object(kind) == chunk_obj == META.chunk_head(kind)["object"]
    assert body_object(kind) == body_obj


CHUNKS = [
    # (kind, args, kwargs, the JSON it encodes to)
    ("completion", ("a", None, None, False), {},
     '{"choices":[{"index":0,"logprobs":null,"finish_reason":null,"text":"a"}]}'),
    ("completion", (None, None, "stop", True), {},
     '{"choices":[{"index":0,"logprobs":null,"finish_reason":"stop","text":""}],"usage":null}'),
    ("chat", ("", None, None, False), {"role": True},
     '{"choices":[{"index":0,"logprobs":null,"finish_reason":null,'
     '"delta":{"role":"assistant","content":""}}]}'),
    ("chat", (None, None, "length", False), {},
     '{"choices":[{"index":0,"logprobs":null,"finish_reason":"length","delta":{}}]}'),
    ("completion", ("a", None, None, False), {"token_ids": (7,), "prompt_token_ids": (1, 2)},
     '{"choices":[{"index":0,"logprobs":null,"finish_reason":null,"text":"a",'
     '"token_ids":[7],"prompt_token_ids":[1,2]}]}'),
    ("chat", ("b", None, None, False), {"token_ids": (8,), "prompt_token_ids": (1,)},
     '{"choices":[{"index":0,"logprobs":null,"finish_reason":null,"delta":{"content":"b"},'
     '"token_ids":[8]}],"prompt_token_ids":[1]}'),
    ("chat", ("b", None, None, True), {"usage": {"total_tokens": 1}},
     '{"choices":[{"index":0,"logprobs":null,"finish_reason":null,"delta":{"content":"b"}}],'
     '"usage":{"total_tokens":1}}'),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "args", "kwargs", "expected"), CHUNKS)
def test_chunk_encodes_byte_for_byte(
    kind: Any, args: tuple[Any, ...], kwargs: dict[str, Any], expected: str
) -> None:
    body = chunk(kind, {}, *args, **kwargs)
    assert json.dumps(body, separators=(",", ":")) == expected


def test_chunk_keeps_the_head_first_and_never_changes_it() -> None:
    head = META.chunk_head("chat")
    body = chunk("chat", head, "x", None, None, False)
    assert list(body)[: len(HEAD_FIELDS)] == list(HEAD_FIELDS)
    assert "choices" not in head


@pytest.mark.parametrize(
    ("kind", "prompt_ids", "where"),
    [("chat", (1, 2), "body"), ("completion", (1, 2), "choice"), ("chat", None, None)],
)
def test_full_body_places_prompt_ids_like_vllm(
    kind: Any, prompt_ids: tuple[int, ...] | None, where: str | None
) -> None:
    body = full_body(kind, META, "hi", "stop", USAGE, None, (5, 6), prompt_ids)
    choice = body["choices"][0]
    assert body["object"] == body_object(kind) and body["usage"] == USAGE
    assert ("message" in choice) == (kind == "chat") and ("text" in choice) == (kind != "chat")
    assert (choice.get("token_ids") == [5, 6]) == (prompt_ids is not None)
    assert ("prompt_token_ids" in body) == (where == "body")
    assert ("prompt_token_ids" in choice) == (where == "choice")
    assert list(body)[-1] == "usage"


def test_usage_chunk_has_no_choices() -> None:
    body = usage_chunk(META.chunk_head("completion"), USAGE)
    assert body["choices"] == [] and body["usage"] == USAGE
    assert list(body) == [*HEAD_FIELDS, "choices", "usage"]
