"""The pure core of request migration: which point a stream resumes from, what the replay asks,
and how the replacement's chunks continue the client's stream (no token repeated or lost)."""

from __future__ import annotations

from typing import Any

import pytest

from loom_router.core.migration import (
    COMPLETIONS_PATH,
    Attempt,
    Boundary,
    StreamTracker,
    completions_body,
    first_attempt,
    max_tokens_of,
)
from loom_router.errors import MigrationFailedError
from loom_runtime.wire.openai.response import ResponseKind, ResponseMeta, chunk, usage_chunk
from loom_runtime.wire.openai.sse import encode
from loom_runtime.wire.openai.usage import usage

HEAD = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 7,
    "model": "m",
    "system_fingerprint": "v1",
}
PROMPT = [1, 2, 3]


def cmpl(text: str, ids: list[int], reason: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": reason,
        "token_ids": ids,
        **extra,
    }
    return {**HEAD, "choices": [choice]}


def chat(
    content: str | None, ids: list[int] | None, role: bool = False, reason: str | None = None
) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    if ids is not None:
        choice["token_ids"] = ids
    return {**HEAD, "id": "chat-1", "object": "chat.completion.chunk", "choices": [choice]}


def feed(tracker: StreamTracker, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [out for e in events if (out := tracker.take(e)) is not None]


def started(kind: str = "completion", **body: Any) -> StreamTracker:
    full = {"model": "m", "max_tokens": 10, "temperature": 0, **body}
    tracker = StreamTracker(kind, full)  # type: ignore[arg-type]
    tracker.begin(first_attempt("/v1/completions", full, kind))  # type: ignore[arg-type]
    return tracker


def test_first_attempt_asks_for_token_ids_and_a_stream() -> None:
    attempt = first_attempt("/v1/chat/completions", {"model": "m", "stream": False}, "chat")
    assert attempt.body["stream"] is True and attempt.body["return_token_ids"] is True
    assert not attempt.resumes


def test_clean_boundaries_are_single_token_chunks_with_text() -> None:
    t = started()
    first = cmpl("A", [10], prompt_token_ids=PROMPT)
    feed(t, [first, cmpl("", [11]), cmpl("BC", [12]), cmpl("D", [13, 14])])
    assert t.prompt_ids == tuple(PROMPT)
    assert t.tokens == [10, 11, 12, 13, 14] and t.text_len == 4
    # [11] had no text (an incomplete character) and [13, 14] was two tokens: not clean.
    assert t.boundary() == Boundary(3, 3)
    assert t.boundary(below_tokens=3) == Boundary(1, 1)
    assert t.boundary(below_tokens=1) == Boundary(0, 0)


@pytest.mark.parametrize(
    ("stop", "next_text", "clean"),
    [
        (["zz"], "xy", True),  # the next text cannot be a held-back stop prefix
        (["zz"], "zq", False),  # it might be: text may have been held back
        (["zz"], None, False),  # nothing came after: unknown
    ],
)
def test_with_stop_strings_a_boundary_waits_for_the_next_text(
    stop: list[str], next_text: str | None, clean: bool
) -> None:
    t = started(stop=stop)
    events = [cmpl("A", [10], prompt_token_ids=PROMPT)]
    if next_text is not None:
        events.append(cmpl(next_text, [11, 12]))  # two tokens: itself never a boundary
    feed(t, events)
    assert t.boundary() == (Boundary(1, 1) if clean else Boundary(0, 0))


def test_replay_continues_from_prompt_plus_tokens_with_reduced_max_tokens() -> None:
    t = started(stop=None, logprobs=1, stream_options={"include_usage": True})
    feed(t, [cmpl("A", [10], prompt_token_ids=PROMPT), cmpl("B", [11]), cmpl("", [12])])
    body = {
        "model": "m",
        "prompt": "text",
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    attempt = t.replay("/v1/completions", body)
    assert attempt.path == COMPLETIONS_PATH
    assert attempt.body["prompt"] == [1, 2, 3, 10, 11]
    assert attempt.body["max_tokens"] == 8 and attempt.body["logprobs"] == 1
    assert attempt.body["return_token_ids"] is True and attempt.body["temperature"] == 0
    assert (attempt.token_base, attempt.char_base) == (2, 2)
    assert (attempt.skip_tokens, attempt.skip_chars) == (1, 0)
    assert attempt.expected == (12,)


def test_resumed_chunks_skip_what_the_client_has_and_keep_the_original_head() -> None:
    t = started()
    sent = feed(t, [cmpl("A", [10], prompt_token_ids=PROMPT), cmpl("", [11])])
    t.begin(t.replay("/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 10}))
    other = {
        "id": "cmpl-OTHER",
        "created": 99,
        "object": "text_completion",
        "model": "m",
        "system_fingerprint": "v1",
    }
    replayed = [  # the replacement regenerates 11 (with its completed character), then goes on
        {
            **other,
            "choices": [
                {
                    "index": 0,
                    "text": "é",
                    "token_ids": [11],
                    "finish_reason": None,
                    "prompt_token_ids": [1, 2, 3, 10],
                }
            ],
        },
        {
            **other,
            "choices": [{"index": 0, "text": "Z", "token_ids": [12], "finish_reason": "length"}],
        },
    ]
    out = feed(t, replayed)
    assert [c["id"] for c in sent + out] == ["cmpl-1"] * 4
    assert [c["choices"][0]["text"] for c in sent + out] == ["A", "", "é", "Z"]
    assert t.tokens == [10, 11, 12] and not t.diverged and t.finished
    assert all("token_ids" not in c["choices"][0] for c in out)  # the client did not ask


def test_a_replay_that_regenerates_other_tokens_is_flagged() -> None:
    t = started()
    feed(t, [cmpl("A", [10], prompt_token_ids=PROMPT), cmpl("", [11])])
    t.begin(t.replay("/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 10}))
    feed(t, [cmpl("x", [99])])
    assert t.diverged


def test_without_prompt_ids_the_original_is_resent_and_everything_sent_is_skipped() -> None:
    t = started()
    feed(t, [cmpl("AB", [10]), cmpl("C", [11])])  # a backend without return_token_ids' prompt
    body = {"model": "m", "prompt": "p", "max_tokens": 10, "kv_transfer_params": {"x": 1}}
    attempt = t.replay("/v1/completions", body)
    assert attempt.path == "/v1/completions" and attempt.body["prompt"] == "p"
    assert "kv_transfer_params" not in attempt.body
    assert (attempt.skip_tokens, attempt.skip_chars, attempt.token_base) == (2, 3, 0)
    t.begin(attempt)
    out = feed(t, [cmpl("AB", [10]), cmpl("CD", [11]), cmpl("E", [12], "length")])
    assert [c["choices"][0]["text"] for c in out] == ["D", "E"]
    assert t.text_len == 5 and t.tokens == [10, 11, 12]


STRUCTURED = [
    {"response_format": {"type": "json_object"}},
    {"structured_outputs": {"regex": "[0-9]+"}},
]


@pytest.mark.parametrize("asks", STRUCTURED)
@pytest.mark.parametrize("fixed", [{"temperature": 0}, {"temperature": 1.0, "seed": 4}])
def test_a_structured_stream_is_regenerated_from_its_original_request(
    asks: dict[str, Any], fixed: dict[str, Any]
) -> None:
    """Its grammar's state stays on the failed worker: the original request again (a fresh
    matcher reads the regenerated tokens), never prompt + tokens, which would restart the
    grammar in the middle of the output."""
    t = started()
    feed(t, [cmpl("A", [10], prompt_token_ids=PROMPT), cmpl("B", [11])])
    body = {"model": "m", "prompt": "p", "max_tokens": 10, **fixed, **asks}
    attempt = t.replay("/v1/completions", body)
    assert attempt.body["prompt"] == "p" and attempt.token_base == 0
    assert {k: attempt.body[k] for k in asks} == asks
    assert (attempt.skip_tokens, attempt.expected) == (2, (10, 11))


@pytest.mark.parametrize("asks", STRUCTURED)
def test_a_sampled_unseeded_structured_stream_is_not_moved(asks: dict[str, Any]) -> None:
    t = started()
    feed(t, [cmpl("A", [10], prompt_token_ids=PROMPT)])
    with pytest.raises(MigrationFailedError, match="structured output sampled without a seed"):
        t.replay("/v1/completions", {"model": "m", "prompt": "p", "temperature": 1.0, **asks})
    fresh = started()  # nothing sent yet: resending it is a plain retry
    assert fresh.replay("/v1/completions", {"model": "m", "prompt": "p", **asks}).body["prompt"]


def test_chat_resumes_as_a_completion_and_is_told_as_chat() -> None:
    t = started(
        "chat",
        max_tokens=None,
        max_completion_tokens=6,
        return_token_ids=True,
        logprobs=True,
        top_logprobs=1,
        stop=["END"],
    )
    head = chat("", None, role=True)
    head["prompt_token_ids"] = PROMPT
    sent = feed(t, [head, chat("Hi", [10]), chat(" there", [11])])
    assert sent[0]["prompt_token_ids"] == PROMPT and sent[0]["choices"][0]["delta"]["role"]
    assert t.boundary() == Boundary(1, 2)  # " there" does not start like "END"
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_completion_tokens": 6,
        "logprobs": True,
        "top_logprobs": 1,
        "stop": ["END"],
        "return_token_ids": True,
        "stream": True,
    }
    attempt = t.replay("/v1/chat/completions", body)
    assert attempt.path == COMPLETIONS_PATH and attempt.source_kind == "completion"
    assert "messages" not in attempt.body and "max_completion_tokens" not in attempt.body
    assert attempt.body["prompt"] == [1, 2, 3, 10] and attempt.body["max_tokens"] == 5
    assert attempt.body["logprobs"] == 1 and attempt.body["stop"] == ["END"]
    t.begin(attempt)
    lp = {
        "tokens": [" there", "!"],
        "token_logprobs": [-0.5, -0.1],
        "top_logprobs": [{" there": -0.5}, {"!": -0.1}],
        "text_offset": [0, 6],
    }
    out = feed(t, [cmpl(" there!", [11, 12], "stop", logprobs=lp)])
    (last,) = out
    assert last["object"] == "chat.completion.chunk" and last["id"] == "chat-1"
    choice = last["choices"][0]
    assert choice["delta"] == {"content": "!"} and choice["token_ids"] == [12]
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["!"]
    assert choice["logprobs"]["content"][0]["bytes"] == [33]
    assert "prompt_token_ids" not in last


def test_usage_counts_the_whole_request_after_a_resume() -> None:
    t = started(stream_options={"include_usage": True})
    feed(t, [cmpl("A", [10], prompt_token_ids=PROMPT), cmpl("B", [11])])
    attempt = t.replay("/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 10})
    t.begin(attempt)
    usage = {
        **HEAD,
        "choices": [],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 8,
            "total_tokens": 13,
            "prompt_tokens_details": {"cached_tokens": 5},
        },
    }
    out = t.take(usage)
    assert out is not None and out["usage"]["prompt_tokens"] == 3
    assert out["usage"]["completion_tokens"] == 10 and out["usage"]["total_tokens"] == 13
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 3


def test_completion_logprob_offsets_move_to_the_clients_text() -> None:
    t = started(logprobs=0)
    feed(t, [cmpl("Hello", [10], prompt_token_ids=PROMPT)])
    t.begin(Attempt("/v1/completions", {}, "completion", token_base=1, char_base=5))
    lp = {"tokens": [" x"], "token_logprobs": [-1.0], "top_logprobs": [{}], "text_offset": [0]}
    (out,) = feed(t, [cmpl(" x", [11], logprobs=lp)])
    assert out["choices"][0]["logprobs"]["text_offset"] == [5]


def test_a_budget_already_spent_resumes_from_an_earlier_boundary() -> None:
    t = started(max_tokens=2)
    feed(t, [cmpl("A", [10], prompt_token_ids=PROMPT), cmpl("B", [11])])
    attempt = t.replay("/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 2})
    assert attempt.body["max_tokens"] == 1 and attempt.token_base == 1


@pytest.mark.parametrize(
    ("kind", "body", "prompt_len", "max_len", "expected"),
    [
        ("completion", {}, 5, None, 16),  # OpenAI's default for completions
        ("completion", {"max_tokens": 7}, 5, None, 7),
        ("chat", {"max_tokens": 7, "max_completion_tokens": 9}, 5, None, 9),
        ("chat", {}, 5, 100, 95),  # the rest of the context
        ("chat", {}, 5, None, None),  # unknown: the relay resends the original instead
    ],
)
def test_max_tokens_of_the_original(
    kind: str, body: dict[str, Any], prompt_len: int, max_len: int | None, expected: int | None
) -> None:
    assert max_tokens_of(kind, body, prompt_len, max_len) == expected  # type: ignore[arg-type]


def test_a_chat_without_a_budget_and_no_context_length_is_resent_whole() -> None:
    t = started("chat", max_tokens=None)
    head = chat("", None, role=True)
    head["prompt_token_ids"] = PROMPT
    feed(t, [head, chat("Hi", [10])])
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    attempt = t.replay("/v1/chat/completions", body, None)
    assert attempt.path == "/v1/chat/completions" and attempt.skip_tokens == 1
    resumed = t.replay("/v1/chat/completions", body, 50)
    assert resumed.path == COMPLETIONS_PATH and resumed.body["max_tokens"] == 50 - 3 - 1


def test_completions_body_drops_chat_only_fields() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [],
        "tools": None,
        "response_format": {"type": "text"},
        "seed": 3,
        "top_k": 5,
        "ignore_eos": True,
    }
    out = completions_body("chat", body, [1, 2], 4, 1)
    assert set(out) == {
        "model",
        "seed",
        "top_k",
        "ignore_eos",
        "prompt",
        "max_tokens",
        "stream",
        "return_token_ids",
    }


def test_chat_role_chunk_is_not_repeated_after_a_restart() -> None:
    t = started("chat")
    feed(t, [chat("", [], role=True)])  # no prompt ids: a backend without return_token_ids
    t.begin(t.replay("/v1/chat/completions", {"model": "m", "messages": []}))
    out = feed(t, [chat("", [], role=True), chat("Hi", [10])])
    assert [c["choices"][0]["delta"] for c in out] == [{"content": "Hi"}]


def test_a_continuation_shrinks_min_tokens_by_what_was_already_sent() -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": 10, "min_tokens": 6}
    assert completions_body("completion", body, [1, 2, 3], 6, 4)["min_tokens"] == 2
    assert completions_body("completion", body, [1, 2, 3], 2, 8)["min_tokens"] == 0
    assert "min_tokens" not in completions_body("completion", {"model": "m"}, [1], 4, 1)


def _worker_stream(
    kind: ResponseKind, with_ids: bool, role_ids: tuple[int, ...] | None = None
) -> list[dict[str, Any]]:
    """A worker's chunks as its server encodes them (usage on every chunk, then a usage chunk)."""
    meta = ResponseMeta("w-1", 7, "m", "v1")
    head = meta.chunk_head(kind)
    ids = (lambda i: (i,)) if with_ids else (lambda i: None)
    out = []
    if kind == "chat":
        prompt_ids = PROMPT if with_ids else None
        out.append(
            chunk(kind, head, "", None, None, True, True, role_ids, prompt_ids, usage(3, 0, 0))
        )
    prompt = PROMPT if with_ids and kind == "completion" else None
    out.append(chunk(kind, head, "A", None, None, True, False, ids(10), prompt, usage(3, 1, 0)))
    out.append(chunk(kind, head, "B", None, "stop", True, False, ids(11), None, usage(3, 2, 0)))
    out.append(usage_chunk(head, usage(3, 2, 0)))
    return out


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("with_ids", [True, False])
def test_a_stream_that_never_moves_is_relayed_byte_for_byte(
    kind: ResponseKind, with_ids: bool
) -> None:
    """The router encodes what it relays with the worker's codec: same bytes, same key order."""
    # As it always has, the router's role chunk lists its (no) token ids when they were asked for.
    client = _worker_stream(kind, with_ids, () if with_ids else None)
    tracker = started(kind, return_token_ids=with_ids)
    upstream = _worker_stream(kind, True)  # the router always asks for token ids
    sent = feed(tracker, upstream)
    assert [encode(e) for e in sent] == [encode(e) for e in client]
