"""P/D == aggregated, token for token: 50 prompts of 1-3k tokens through the minimal P/D proxy,
with NIXL and with TCP, prefill and decode on different KV block sizes (32 vs 16, so every pull
converts layout), and with prefix-cache hits on the decode (which then pulls only the rest).

Greedy, float64 workers (batched-vs-unbatched last bits cannot flip a choice), 8 output tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import torch

from loom_runtime.testing.processes import Launcher, Proc, poll, post
from loom_runtime.wire.headers import PD_HEADER

MODEL = "tiny-pd"

# Three passes of 50 prompts of 1-3k float64 tokens: minutes on a small shared machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MAX_TOKENS = 8
SHARED = 1024  # tokens of the common prefix of a prompt group
COMMON = ["--max-model-len", "4096", "--max-num-seqs", "4"]
KINDS = ["nixl", "tcp"]


def random_prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(10, 4000, (n,), generator=gen)]


def length(i: int) -> int:
    """1000..3000 tokens over i = 0..24, denser at the short end (prefill cost grows with the
    square of the length; the long end is still covered)."""
    return 1000 + 2000 * i * i // (24 * 24)


def parity_prompts() -> list[list[int]]:
    """25 unrelated prompts, then 5 groups of 5 sharing a 1024-token prefix; 1000..3000 tokens."""
    prompts = [random_prompt(length(i), seed=100 + i) for i in range(25)]
    for g in range(5):
        prefix = random_prompt(SHARED, seed=1000 + g)
        for j in range(5):
            total = max(length(g * 5 + j), SHARED + 100)
            prompts.append(prefix + random_prompt(total - SHARED, seed=2000 + 10 * g + j))
    return prompts


PROMPTS = parity_prompts()
FIRST_OF_GROUP = {25 + 5 * g for g in range(5)}


def body(prompt: list[int], **more: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 1,
        **more,
    }


def assert_same_tokens(pd: dict[str, Any], agg: dict[str, Any], what: str) -> None:
    a, b = pd["choices"][0], agg["choices"][0]
    assert b["logprobs"]["tokens"] and len(b["logprobs"]["tokens"]) == MAX_TOKENS
    assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"], what
    assert a["text"] == b["text"], what
    assert a["logprobs"]["token_logprobs"] == pytest.approx(
        b["logprobs"]["token_logprobs"], abs=1e-6
    ), what
    assert pd["usage"]["completion_tokens"] == agg["usage"]["completion_tokens"] == MAX_TOKENS


@dataclass
class Fleet:
    aggregated: Proc
    pairs: dict[str, tuple[Proc, Proc, Proc]]  # kind -> (prefill, decode, proxy)


@pytest.fixture(scope="module")
def fleet(launcher: Launcher) -> Iterator[Fleet]:
    """An aggregated worker, and per connector a prefill (block size 32) and a decode (block
    size 16) behind a proxy."""
    with ExitStack() as stack:
        aggregated = stack.enter_context(
            launcher.worker("aggregated", "--num-blocks", "600", *COMMON)
        )
        pairs = {}
        for kind in KINDS:
            prefill = stack.enter_context(
                launcher.worker(
                    "prefill",
                    "--kv-connector",
                    kind,
                    "--block-size",
                    "32",
                    "--num-blocks",
                    "300",
                    *COMMON,
                    name=f"prefill-{kind}",
                )
            )
            decode = stack.enter_context(
                launcher.worker(
                    "decode",
                    "--kv-connector",
                    kind,
                    "--block-size",
                    "16",
                    "--num-blocks",
                    "600",
                    *COMMON,
                    name=f"decode-{kind}",
                )
            )
            proxy = stack.enter_context(launcher.proxy(prefill, decode, name=f"proxy-{kind}"))
            pairs[kind] = (prefill, decode, proxy)
        yield Fleet(aggregated, pairs)


Answers = list[tuple[int, Any, dict[str, str]]]


@pytest.fixture(scope="module")
def answers(fleet: Fleet) -> dict[str, Answers]:
    """Every prompt, in order, through the aggregated worker and through each P/D pair. The three
    passes run at once (one worker process per core), each pass strictly in prompt order."""

    def run(base_url: str) -> Answers:
        return [post(base_url + "/v1/completions", body(prompt)) for prompt in PROMPTS]

    urls = {"aggregated": fleet.aggregated.base_url}
    urls.update({kind: pair[2].base_url for kind, pair in fleet.pairs.items()})
    with ThreadPoolExecutor(len(urls)) as pool:
        futures = {name: pool.submit(run, url) for name, url in urls.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_pd_output_equals_aggregated_for_50_long_prompts(
    fleet: Fleet, answers: dict[str, Answers], kind: str
) -> None:
    prefill, decode, _ = fleet.pairs[kind]
    expected_pull = 0
    for i, (prompt, (status, answer, headers), (ref_status, ref, _)) in enumerate(
        zip(PROMPTS, answers[kind], answers["aggregated"], strict=True)
    ):
        assert status == ref_status == 200, (i, answer, ref)
        assert headers[PD_HEADER] == "remote-prefill", i  # the KV really came from the prefill
        assert_same_tokens(answer, ref, f"prompt {i} ({len(prompt)} tokens)")
        cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        if i >= 25 and i not in FIRST_OF_GROUP:
            assert cached >= SHARED, i  # the group's prefix is a decode-side cache hit
        elif i < 25:
            assert cached == 0, i
        expected_pull += len(prompt) - 1 - cached  # everything but the hits and the last token
    # The decode pulled exactly the uncached part of every prompt, nothing more.
    assert decode.metric("loom:kv_pulled_tokens_total") == expected_pull
    assert decode.metric("loom:kv_transfer_failures_total") == 0
    poll(prefill.pool_whole, 30, "the prefill to free every pulled lease")
    poll(decode.pool_whole, 30, "the decode's pool to be whole")
    assert prefill.metric("loom:kv_expired_total") == 0


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_and_chat_pd_equal_aggregated(
    fleet: Fleet, answers: dict[str, Answers], kind: str
) -> None:
    assert answers[kind]  # after the 50-prompt pass, so its pull counts stay exact
    _, decode, proxy = fleet.pairs[kind]
    aggregated = fleet.aggregated
    client = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key="unused", max_retries=0)
    agg = openai.OpenAI(base_url=aggregated.base_url + "/v1", api_key="unused", max_retries=0)
    try:
        prompt = random_prompt(1500, seed=7)
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "extra_body": {"ignore_eos": True},
        }
        whole = agg.completions.create(prompt=prompt, **kwargs).choices[0].text
        chunks = list(client.completions.create(prompt=prompt, stream=True, **kwargs))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
        messages: list[Any] = [
            {"role": "system", "content": "Answer briefly. " * 60},
            {"role": "user", "content": "Tell me about the sea. " * 40},
        ]
        chat_agg = agg.chat.completions.create(messages=messages, **kwargs)
        chat_pd = client.chat.completions.create(messages=messages, **kwargs)
        assert chat_pd.choices[0].message.content == chat_agg.choices[0].message.content
        assert chat_pd.usage is not None and chat_pd.usage.completion_tokens == MAX_TOKENS
    finally:
        client.close()
        agg.close()
    poll(decode.pool_whole, 30, "the decode's pool to be whole")


def test_transfer_flags_must_fit_the_workers_role(fleet: Fleet) -> None:
    prefill, decode, _ = fleet.pairs["tcp"]
    to_prefill: dict[str, Any] = {"kv_transfer_params": {"do_remote_decode": True}}
    cases: list[tuple[Proc, dict[str, Any], str, str]] = [
        (fleet.aggregated, to_prefill, "kv_transfer_params.do_remote_decode", "--role aggregated"),
        (decode, to_prefill, "kv_transfer_params.do_remote_decode", "--role decode"),
        (prefill, {**to_prefill, "stream": True}, "stream", "stream: false"),
        (
            decode,
            {"kv_transfer_params": {"do_remote_prefill": True}},
            "kv_transfer_params.remote_engine_id",
            "unchanged",
        ),
    ]
    for worker, extra, param, hint in cases:
        status, answer, _ = post(worker.base_url + "/v1/completions", body([11, 12, 13], **extra))
        assert status == 400, (worker.name, answer)
        assert answer["error"]["param"] == param and hint in answer["error"]["message"]
