"""The router renders and tokenizes prompts exactly as the runtime does (else the precise prefix
scorer would hash other blocks than the engine caches)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loom_router.errors import RouterConfigError
from loom_router.shell.prompt_tokens import PromptTokenizer
from loom_runtime.models.tiny import init_tiny
from loom_runtime.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("tiny-tok"), seed=0)


CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "Be brief. ünïcode ✓"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more", "name": "bob"},
    ],
]


def test_ids_equal_the_runtime_tokenizers(checkpoint: Path) -> None:
    router = PromptTokenizer(checkpoint)
    runtime = Tokenizer.from_dir(checkpoint)
    for text in ("Once upon a time", "ünïcode ✓ and\nnewlines  "):
        assert router.completion_ids(text) == runtime.encode(text)
        assert router.completion_ids([text]) == runtime.encode(text)
    for messages in CHATS:
        joined = [
            {**m, "content": "".join(p["text"] for p in m["content"])}
            if isinstance(m["content"], list)
            else m
            for m in messages
        ]
        assert router.chat_ids(messages) == runtime.encode_chat(joined)


def test_token_id_prompts_pass_through_and_bad_input_is_not_an_error(checkpoint: Path) -> None:
    router = PromptTokenizer(checkpoint / "tokenizer.json")  # a file works too
    assert router.completion_ids([5, 6, 7]) == [5, 6, 7]
    assert router.completion_ids([[5, 6]]) == [5, 6]
    assert router.completion_ids(3) is None and router.completion_ids("") is None
    assert router.chat_ids([{"role": "user", "content": 5}]) is None
    assert router.chat_ids("hi") is None


def test_a_missing_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(RouterConfigError, match="tokenizer_path"):
        PromptTokenizer(tmp_path)
