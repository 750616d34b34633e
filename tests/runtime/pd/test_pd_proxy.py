"""The test-only P/D proxy prefills a list of prompts, and a request asking for prompt log-probs,
on the decode (as the router does: one KV lease answers one prompt, and prompt log-probs are
where the prompt is prefilled); one prompt still goes to the prefill. Answers equal an
aggregated worker's (float64, greedy)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from loom_runtime.testing.processes import Launcher, Proc, post
from loom_runtime.wire.headers import PD_HEADER

COMMON = ["--kv-connector", "tcp", "--max-model-len", "512", "--num-blocks", "96"]


@pytest.fixture(scope="module")
def pair(launcher: Launcher) -> Iterator[dict[str, Proc]]:
    with ExitStack() as stack:
        prefill = stack.enter_context(launcher.worker("prefill", *COMMON))
        decode = stack.enter_context(launcher.worker("decode", *COMMON))
        yield {
            "proxy": stack.enter_context(launcher.proxy(prefill, decode)),
            "aggregated": stack.enter_context(
                launcher.worker("aggregated", "--max-model-len", "512", "--num-blocks", "96")
            ),
        }


def fallbacks(proxy: Proc) -> int:
    """Times the proxy fell back to a local prefill after the prefill refused or failed."""
    text = proxy.log.read_text(errors="replace")
    return text.count("prefill answered") + text.count("prefill failed")


def body(launcher: Launcher, prompt: Any, **more: Any) -> dict[str, Any]:
    return {"model": launcher.model, "prompt": prompt, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "logprobs": 1, **more}  # fmt: skip


@pytest.mark.parametrize(
    ("prompt", "more", "mode"),
    [
        ([[11, 12, 13, 14, 15, 16], "Once upon a time"], {}, "local-prefill"),
        ([21, 22, 23, 24, 25, 26, 27], {"echo": True}, "local-prefill"),
        ([21, 22, 23, 24, 25, 26, 27], {"prompt_logprobs": 1}, "local-prefill"),
        ([21, 22, 23, 24, 25, 26, 27], {}, "remote-prefill"),
    ],
    ids=["prompt-list", "echo", "prompt_logprobs", "one-prompt"],
)
def test_the_proxy_prefills_lists_and_prompt_logprobs_on_the_decode(
    launcher: Launcher, pair: dict[str, Proc], prompt: Any, more: dict[str, Any], mode: str
) -> None:
    before = fallbacks(pair["proxy"])
    status, got, headers = post(pair["proxy"].base_url + "/v1/completions",
                                body(launcher, prompt, **more))  # fmt: skip
    assert status == 200, got
    assert headers[PD_HEADER] == mode
    # decided by the proxy, not a prefill's 400 (a list or prompt log-probs with
    # kv_transfer_params) that it fell back from
    assert fallbacks(pair["proxy"]) == before
    want = post(pair["aggregated"].base_url + "/v1/completions", body(launcher, prompt, **more))[1]
    assert len(got["choices"]) == len(want["choices"]) == (2 if mode == "local-prefill" and
                                                            not more else 1)  # fmt: skip
    for a, b in zip(got["choices"], want["choices"], strict=True):
        assert a["text"] == b["text"] and a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
        if mode == "local-prefill":  # the decode ran the aggregated worker's steps exactly
            assert a == b
        else:  # pulled KV: the same tokens, log-probs to the last bits (as test_pd_parity)
            lps = b["logprobs"]["token_logprobs"]
            assert a["logprobs"]["token_logprobs"] == pytest.approx(lps, abs=1e-6)
