"""vLLM's /tokenize and /detokenize on a live worker: the ids the OpenAI routes run, in vLLM's
shapes, and the text of ids back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

MAX_MODEL_LEN = 512
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


def _prompt_ids(worker: Any, path: str, body: dict[str, Any]) -> list[int]:
    """The prompt ids a generation route ran (vLLM's return_token_ids)."""
    status, answer, _ = worker.post(path, {"model": worker.model, "max_tokens": 1,
                                           "return_token_ids": True, **body})  # fmt: skip
    assert status == 200, answer
    ids = answer.get("prompt_token_ids") or answer["choices"][0]["prompt_token_ids"]
    return list(ids)


def test_tokenize_a_prompt_gives_the_ids_completions_run(worker: Any) -> None:
    status, answer, _ = worker.post("/tokenize", {"model": worker.model, "prompt": "hello world"})
    assert status == 200, answer
    assert set(answer) == {"count", "max_model_len", "tokens", "token_strs"}
    assert answer["tokens"] == _prompt_ids(worker, "/v1/completions", {"prompt": "hello world"})
    assert answer["count"] == len(answer["tokens"]) and answer["token_strs"] is None
    assert answer["max_model_len"] == MAX_MODEL_LEN
    bare = worker.post("/tokenize", {"prompt": "hello world", "add_special_tokens": False})[1]
    assert bare["tokens"] == answer["tokens"][-len(bare["tokens"]) :]
    assert len(bare["tokens"]) < len(answer["tokens"])  # the tiny tokenizer adds BOS


def test_tokenize_messages_gives_the_ids_chat_runs_and_token_strings(worker: Any) -> None:
    status, answer, _ = worker.post("/tokenize", {"messages": CHAT, "return_token_strs": True})
    assert status == 200, answer
    assert answer["tokens"] == _prompt_ids(worker, "/v1/chat/completions", {"messages": CHAT})
    assert len(answer["token_strs"]) == answer["count"]
    assert all(isinstance(s, str) and s for s in answer["token_strs"])
    without = worker.post("/tokenize", {"messages": CHAT, "add_generation_prompt": False})[1]
    assert without["count"] < answer["count"]


def test_detokenize_returns_the_text_of_the_ids(worker: Any) -> None:
    ids = worker.post("/tokenize", {"prompt": "hello world", "add_special_tokens": False})[1]
    status, answer, _ = worker.post("/detokenize", {"model": worker.model, "tokens": ids["tokens"]})
    assert status == 200 and answer == {"prompt": "hello world"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/detokenize", {"tokens": [10**6]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
        ("/tokenize", {}, 400, "prompt"),
        (
            "/tokenize",
            {"messages": CHAT, "tools": [{"type": "function"}]},
            400,
            "tools[0].function",
        ),
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, None),
    ],
)
def test_bad_tokenize_bodies_name_their_field(
    worker: Any, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    got, answer, _ = worker.post(path, body)
    assert got == status, answer
    if param is not None:
        assert answer["error"]["param"] == param
