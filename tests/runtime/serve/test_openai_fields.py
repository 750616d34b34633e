"""A live worker under the official openai client with the request fields of issue #36's first
slice: logit_bias, the developer role, and a refused field answered with a 400 naming it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


def _ids(client: openai.OpenAI, model: str, **more: Any) -> list[int]:
    done = client.completions.create(
        model=model, prompt="The quick brown fox", max_tokens=6, temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True}, **more,
    )  # fmt: skip
    return list(done.choices[0].token_ids)


def test_logit_bias_forces_and_bans_tokens_through_the_sdk(
    worker: Any, client: openai.OpenAI
) -> None:
    plain = _ids(client, worker.model)
    forced = 42 if plain[0] != 42 else 43
    assert _ids(client, worker.model, logit_bias={str(forced): 100}) == [forced] * 6
    banned = _ids(client, worker.model, logit_bias={str(plain[0]): -100})
    assert plain[0] not in banned
    assert _ids(client, worker.model, logit_bias={}) == plain


def test_logit_bias_in_chat_and_out_of_the_vocabulary(worker: Any, client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model=worker.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        temperature=0, logit_bias={"42": 100}, extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert list(done.choices[0].token_ids) == [42] * 3  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=worker.model, prompt="x", logit_bias={"999999": 5})
    assert err.value.body["param"] == "logit_bias"  # type: ignore[index]


def test_developer_is_system_where_the_template_has_no_such_role(
    worker: Any, client: openai.OpenAI
) -> None:
    """The tiny checkpoint's template refuses any role but system/user/assistant/tool."""

    def prompt_ids(role: str) -> list[int]:
        done = client.chat.completions.create(
            model=worker.model, max_tokens=1, temperature=0,
            messages=[{"role": role, "content": "be brief"}, {"role": "user", "content": "hi"}],  # type: ignore[misc, list-item]
            extra_body={"return_token_ids": True},
        )  # fmt: skip
        return list(done.prompt_token_ids)  # type: ignore[attr-defined]

    assert prompt_ids("developer") == prompt_ids("system")


@pytest.mark.parametrize(
    ("field", "value"),
    [("frequency_penalty", 0.5), ("presence_penalty", 0.5), ("suffix", "y")],
)
def test_a_refused_field_is_a_400_naming_it(
    worker: Any, client: openai.OpenAI, field: str, value: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=worker.model, prompt="x", **{field: value})
    assert err.value.body["param"] == field  # type: ignore[index]
    assert "not supported" in err.value.body["message"]  # type: ignore[index]


def test_a_meaningless_field_is_accepted_and_not_named_as_ignored(worker: Any) -> None:
    status, _, headers = worker.post("/v1/chat/completions", {
        "model": worker.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
        "user": "u1", "store": False, "metadata": {"k": "v"}, "frobnicate": 1})  # fmt: skip
    assert status == 200
    assert headers["x-loom-ignored-fields"] == "frobnicate"


PROMPTS: list[Any] = ["The quick brown fox", [11, 12, 13, 14, 15], "Once upon a time"]


def _alone(client: openai.OpenAI, model: str, prompt: Any) -> openai.types.Completion:
    return client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0,
                                      logprobs=1, extra_body={"ignore_eos": True})  # fmt: skip


def _tokens(choice: Any) -> list[str]:
    assert choice.logprobs is not None
    return list(choice.logprobs.tokens)


def test_a_list_of_prompts_is_one_choice_each_in_order(worker: Any, client: openai.OpenAI) -> None:
    alone = [_alone(client, worker.model, p) for p in PROMPTS]
    done = client.completions.create(
        model=worker.model,
        prompt=PROMPTS,
        max_tokens=5,
        temperature=0,
        logprobs=1,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert [c.text for c in done.choices] == [a.choices[0].text for a in alone]
    assert [_tokens(c) for c in done.choices] == [_tokens(a.choices[0]) for a in alone]
    assert done.usage is not None and done.usage.completion_tokens == 15
    assert done.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone if a.usage)


def test_a_list_of_prompts_streams_each_choice_under_its_index(
    worker: Any, client: openai.OpenAI
) -> None:
    alone = [_alone(client, worker.model, p).choices[0] for p in PROMPTS]
    stream = client.completions.create(
        model=worker.model,
        prompt=PROMPTS,
        max_tokens=5,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True},
    )
    texts, usage = ["", "", ""], None
    reasons: list[str | None] = [None, None, None]
    for event in stream:
        for c in event.choices:
            texts[c.index] += c.text
            reasons[c.index] = c.finish_reason or reasons[c.index]
        usage = event.usage or usage
    assert texts == [a.text for a in alone] and reasons == ["length"] * 3
    assert usage is not None and usage.completion_tokens == 15


def test_chat_template_kwargs_are_rendered_and_the_requests_own_variables_refused(
    worker: Any,
) -> None:
    body = {"model": worker.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1}  # fmt: skip
    thinking_off = {**body, "chat_template_kwargs": {"enable_thinking": False}}
    status, _, _ = worker.post("/v1/chat/completions", thinking_off)
    assert status == 200
    status, answer, _ = worker.post("/v1/chat/completions",
                                    {**body, "chat_template_kwargs": {"messages": []}})  # fmt: skip
    assert status == 400 and answer["error"]["param"] == "chat_template_kwargs"
