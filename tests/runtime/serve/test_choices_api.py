"""n > 1 and best_of on a live worker of the tiny model, through the official openai client: each
choice equals the one-choice request with its own seed (seed + its position), a seeded request
is reproducible, a stream interleaves the choices by index and says what the whole answer says,
usage counts the prompt once, and best_of returns the likeliest samples."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import openai
import pytest

ASK: list[Any] = [{"role": "user", "content": "Tell me a story about a loom."}]


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


def test_each_chat_choice_equals_the_one_choice_request_with_its_own_seed(
    client: openai.OpenAI, worker: Any
) -> None:
    many = client.chat.completions.create(
        model=worker.model, messages=ASK, n=3, seed=11, temperature=1.0, max_tokens=12
    )
    assert [c.index for c in many.choices] == [0, 1, 2]
    texts = [c.message.content for c in many.choices]
    ones = [
        client.chat.completions.create(
            model=worker.model, messages=ASK, seed=11 + k, temperature=1.0, max_tokens=12
        )
        for k in range(3)
    ]
    assert [one.choices[0].message.content for one in ones] == texts
    assert len(set(texts)) > 1  # each its own generator
    again = client.chat.completions.create(
        model=worker.model, messages=ASK, n=3, seed=11, temperature=1.0, max_tokens=12
    )
    assert [c.message.content for c in again.choices] == texts
    usages = [one.usage for one in ones if one.usage is not None]
    assert many.usage is not None and len(usages) == 3
    assert many.usage.prompt_tokens == usages[0].prompt_tokens  # the prompt counted once
    assert many.usage.completion_tokens == sum(u.completion_tokens for u in usages)


def test_a_streamed_completion_of_two_prompts_interleaves_their_choices_by_index(
    client: openai.OpenAI, worker: Any
) -> None:
    args: dict[str, Any] = dict(
        model=worker.model, prompt=["Once upon", "The loom"], n=2, seed=5, temperature=0.9,
        max_tokens=10,
    )  # fmt: skip
    whole = client.completions.create(**args)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    parts: dict[int, list[str]] = defaultdict(list)
    order = []
    finished = {}
    for chunk in client.completions.create(**args, stream=True):
        for c in chunk.choices:
            parts[c.index].append(c.text)
            order.append(c.index)
            if c.finish_reason is not None:
                finished[c.index] = c.finish_reason
    assert {i: "".join(p) for i, p in parts.items()} == {c.index: c.text for c in whole.choices}
    assert finished == {c.index: c.finish_reason for c in whole.choices}
    assert sorted(set(order)) == [0, 1, 2, 3]
    seeds = [5, 6, 5, 6]  # per prompt: seed + the sample's position
    for c, seed in zip(whole.choices, seeds, strict=True):
        one = client.completions.create(
            model=worker.model, prompt=["Once upon", "The loom"][c.index // 2], seed=seed,
            temperature=0.9, max_tokens=10,
        )  # fmt: skip
        assert one.choices[0].text == c.text


def test_best_of_returns_the_samples_with_the_highest_cumulative_log_probability(
    client: openai.OpenAI, worker: Any
) -> None:
    args: dict[str, Any] = dict(
        model=worker.model, prompt="A weaver", seed=3, temperature=1.0, max_tokens=8
    )
    every = client.completions.create(**args, n=4, logprobs=0)
    scores = [sum(c.logprobs.token_logprobs or ()) if c.logprobs else 0.0 for c in every.choices]
    ranked = sorted(range(4), key=lambda k: -scores[k])
    best = client.completions.create(**args, n=2, best_of=4)
    assert [c.text for c in best.choices] == [every.choices[k].text for k in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1]
    assert all(c.logprobs is None for c in best.choices)  # not asked for: not returned
    assert best.usage is not None and every.usage is not None
    assert best.usage.completion_tokens == every.usage.completion_tokens  # every sample ran


def test_best_of_below_n_and_a_streamed_best_of_are_refused(
    client: openai.OpenAI, worker: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=worker.model, prompt="x", n=3, best_of=2)
    assert "best_of" in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=worker.model, prompt="x", best_of=2, stream=True)
    assert "cannot be streamed" in str(err.value)
