"""echo and prompt_logprobs on /v1/completions through a real worker and the openai SDK: the
shape lm-evaluation-harness's local-completions reads (prompt tokens first, the first logprob
null) and vLLM's prompt_logprobs, the same numbers both ways; what is not served is a 400."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


PROMPT = [5, 310, 1200, 77, 2048, 901, 13]


def _echo(client: openai.OpenAI, model: str, max_tokens: int, prompt: Any = PROMPT) -> Any:
    return client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                      temperature=0, logprobs=1, echo=True,
                                      extra_body={"ignore_eos": True}).choices[0]  # fmt: skip


def test_echo_with_max_tokens_0_is_the_prompt_and_its_logprobs(
    worker: Any, client: openai.OpenAI
) -> None:
    choice = _echo(client, worker.model, 0)
    lp = choice.logprobs
    assert len(lp.tokens) == len(PROMPT) == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) and x < 0 for x in lp.token_logprobs[1:])
    # the token's own log-prob is among its top_logprobs (with the top alternative), as vLLM
    for tok, own, top in zip(
        lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True
    ):
        assert top[tok] == own and max(top.values()) >= own and len(top) in (1, 2)
    assert choice.text == "".join(lp.tokens)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


def test_echo_with_one_token_appends_the_generated_one(worker: Any, client: openai.OpenAI) -> None:
    """lm-eval sends max_tokens 1 and drops the last entry: the prompt's entries are those of
    max_tokens 0, and the last is the token a plain request generates, with its log-prob."""
    alone = _echo(client, worker.model, 0).logprobs
    both = _echo(client, worker.model, 1)
    plain = client.completions.create(model=worker.model, prompt=PROMPT, max_tokens=1,
                                      temperature=0, logprobs=1,
                                      extra_body={"ignore_eos": True}).choices[0]  # fmt: skip
    assert both.logprobs.token_logprobs[:-1] == alone.token_logprobs
    assert both.logprobs.tokens[-1] == plain.logprobs.tokens[0]
    # a float32 worker: the head over the chunk's 7 rows and over its last row alone may differ
    # in the last bits (the float64 engine tests prove the values exactly)
    assert both.logprobs.token_logprobs[-1] == pytest.approx(
        plain.logprobs.token_logprobs[0], abs=1e-5
    )
    assert both.text == "".join(alone.tokens) + plain.text


def test_a_text_prompt_is_echoed_as_sent(worker: Any, client: openai.OpenAI) -> None:
    choice = _echo(client, worker.model, 2, "The quick brown fox")
    assert choice.text.startswith("The quick brown fox")


def test_prompt_logprobs_are_vllms_shape_and_equal_the_echo(
    worker: Any, client: openai.OpenAI
) -> None:
    echo = _echo(client, worker.model, 0).logprobs
    status, body, _ = worker.post("/v1/completions", {
        "model": worker.model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0,
        "prompt_logprobs": 2})  # fmt: skip
    assert status == 200, body
    choice = body["choices"][0]
    plps = choice["prompt_logprobs"]
    assert len(plps) == len(PROMPT) and plps[0] is None
    assert choice["logprobs"] is None and not choice["text"].startswith(echo.tokens[1])
    for pos, entry in enumerate(plps[1:], 1):
        own = entry[str(PROMPT[pos])]
        assert own["logprob"] == echo.token_logprobs[pos]
        ranks = sorted(v["rank"] for k, v in entry.items() if k != str(PROMPT[pos]))
        assert ranks[:2] == [1, 2][: len(ranks)] and own["rank"] >= 1
        assert isinstance(own["decoded_token"], str)


def test_a_list_of_prompts_echoes_each(worker: Any, client: openai.OpenAI) -> None:
    done = client.completions.create(
        model=worker.model,
        prompt=[PROMPT, PROMPT[:4]],
        max_tokens=1,
        temperature=0,
        logprobs=1,
        echo=True,
    )
    lens = [len(c.logprobs.tokens) for c in sorted(done.choices, key=lambda c: c.index)]
    assert lens == [len(PROMPT) + 1, 5]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 21}, "prompt_logprobs"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 1,
          "stream": True},
         "prompt_logprobs"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_a_400_naming_it(
    worker: Any, path: str, body: dict[str, Any], param: str
) -> None:
    status, answer, _ = worker.post(path, {"model": worker.model, **body})
    assert status == 400, answer
    assert answer["error"]["param"] == param


def test_chat_prompt_logprobs_are_the_rendered_prompts_as_completions_gives_them(
    worker: Any, client: openai.OpenAI
) -> None:
    """vLLM's top-level prompt_logprobs of a chat: the numbers /v1/completions gives for the
    prompt the template rendered (its ids from return_token_ids)."""
    body = {"model": worker.model, "messages": [{"role": "user", "content": "Hello, loom."}],
            "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2,
            "return_token_ids": True}  # fmt: skip
    status, chat, _ = worker.post("/v1/chat/completions", body)
    assert status == 200, chat
    ids = chat["prompt_token_ids"]
    status, done, _ = worker.post("/v1/completions", {
        "model": worker.model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 2})  # fmt: skip
    assert status == 200, done
    assert len(chat["prompt_logprobs"]) == len(ids) and chat["prompt_logprobs"][0] is None
    assert chat["prompt_logprobs"] == done["choices"][0]["prompt_logprobs"]
    assert "prompt_logprobs" not in chat["choices"][0]


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_a_streamed_echo_is_the_whole_answer_chunk_by_chunk(
    worker: Any, client: openai.OpenAI, max_tokens: int
) -> None:
    """The prompt (its text, log-probs and vLLM's prompt_logprobs) is each choice's first
    chunk; what follows, with text offsets after the prompt, adds up to the whole answer."""
    args: dict[str, Any] = dict(model=worker.model, prompt=["Once upon", PROMPT],
                                max_tokens=max_tokens, temperature=0, logprobs=1, echo=True,
                                extra_body={"ignore_eos": True, "prompt_logprobs": 1})  # fmt: skip
    whole = client.completions.create(**args)
    text = ["", ""]
    lp: list[dict[str, list[Any]]] = [{}, {}]
    prompt_lp: list[Any] = [None, None]
    last: Any = None
    for piece in client.completions.create(**args, stream=True,
                                           stream_options={"include_usage": True}):  # fmt: skip
        last = piece
        for c in piece.choices:
            text[c.index] += c.text
            extra = c.model_extra or {}
            if extra.get("prompt_logprobs") is not None:
                prompt_lp[c.index] = extra["prompt_logprobs"]
            for key, values in (c.logprobs.model_dump() if c.logprobs else {}).items():
                lp[c.index].setdefault(key, []).extend(values or [])
    for c in whole.choices:
        assert text[c.index] == c.text
        assert c.logprobs is not None
        assert lp[c.index] == c.logprobs.model_dump()
        assert prompt_lp[c.index] == (c.model_extra or {})["prompt_logprobs"]
    assert last.usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
