"""P/D through the router: the decider sends long prompts to the prefill worker first, and the
answer equals an aggregated worker's token for token (greedy, float64). A prefill that fails
falls back to a local prefill and says so (header, metric), or fails the request by policy."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from loom_runtime.testing.processes import post

MODEL = "tiny-router"
PD = {"disaggregation": {"minUncachedTokens": 64}, "sessionAffinity": {"enabled": False}}
TCP = ("--kv-connector", "tcp")


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 4000) for _ in range(n)]


def body(ids: list[int], **more: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": ids,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 1,
        **more,
    }


@pytest.fixture(scope="module")
def fleet(launch_worker: Any) -> Iterator[dict[str, Any]]:
    """A prefill that takes prompts of at most 511 tokens, a decode, and an aggregated worker
    (not behind the router) that gives the reference answers."""
    with ExitStack() as stack:
        yield {
            "prefill": stack.enter_context(
                launch_worker("prefill", "prefill", *TCP, "--max-model-len", "512")
            ),
            "decode": stack.enter_context(launch_worker("decode", "decode", *TCP)),
            "reference": stack.enter_context(launch_worker("reference", kv_events=False)),
        }


def reference(fleet: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    status, answer, _ = post(fleet["reference"].url + "/v1/completions", body(ids))
    assert status == 200, answer
    return dict(answer["choices"][0])


def streamed(router: Any, ids: list[int]) -> tuple[dict[str, str], list[str], str]:
    stream = router.stream("/v1/completions", body(ids))
    tokens: list[str] = []
    text = ""
    for event in stream.events():
        choice = event["choices"][0]
        text += choice["text"]
        if choice["logprobs"]:
            tokens += choice["logprobs"]["tokens"]
    stream.close()
    return stream.headers, tokens, text


def test_pd_through_the_router_equals_aggregated(fleet: dict[str, Any], launch_router: Any) -> None:
    with launch_router([fleet["prefill"], fleet["decode"]], router=PD) as router:
        router.wait_fresh(["prefill", "decode"])
        for i, n in enumerate((100, 300, 480)):
            ids = prompt(i, n)
            want = reference(fleet, ids)
            status, answer, headers = router.post("/v1/completions", body(ids))
            assert status == 200, answer
            assert headers["x-loom-pd"] == "remote-prefill" and "x-loom-pd-fallback" not in headers
            got = answer["choices"][0]
            assert got["logprobs"]["tokens"] == want["logprobs"]["tokens"]
            assert got["text"] == want["text"] and len(want["logprobs"]["tokens"]) == 8
            headers, tokens, text = streamed(router, prompt(50 + i, n))
            want = reference(fleet, prompt(50 + i, n))
            assert headers["x-loom-pd"] == "remote-prefill"
            assert tokens == want["logprobs"]["tokens"] and text == want["text"]
        assert router.metric("loom_router:pd_total", mode="remote-prefill") == 6
        assert fleet["decode"].counter("loom:kv_pulled_tokens_total") > 0
        # A short prompt is not worth a remote prefill: the decode prefills it itself.
        status, _, headers = router.post("/v1/completions", body(prompt(9, 20)))
        assert status == 200 and headers["x-loom-pd"] == "local-prefill"


def test_a_failed_prefill_falls_back_and_says_so(fleet: dict[str, Any], launch_router: Any) -> None:
    ids = prompt(77, 700)  # longer than the prefill worker's context: it answers 400
    want = reference(fleet, ids)
    with launch_router([fleet["prefill"], fleet["decode"]], router=PD) as router:
        router.wait_fresh(["prefill", "decode"])
        status, answer, headers = router.post("/v1/completions", body(ids))
        assert status == 200, answer
        assert headers["x-loom-pd"] == "local-prefill"
        assert headers["x-loom-pd-fallback"].startswith("status on prefill: answered 400")
        assert answer["choices"][0]["logprobs"]["tokens"] == want["logprobs"]["tokens"]
        assert router.metric("loom_router:pd_fallbacks_total", reason="status") == 1
    failing = {**PD}
    with launch_router(
        [fleet["prefill"], fleet["decode"]], router=failing, failover={"onTransferFailure": "fail"}
    ) as router:
        router.wait_fresh(["prefill", "decode"])
        status, answer, _ = router.post("/v1/completions", body(ids))
        assert status == 502 and answer["error"]["code"] == "prefill_failed"
        assert "onTransferFailure" in answer["error"]["message"]


def test_an_over_length_prompt_is_refused_before_the_prefill_hop(
    fleet: dict[str, Any], launch_router: Any
) -> None:
    """A client's error is not a P/D fault: no prefill runs, no fallback is logged or counted."""
    with launch_router([fleet["prefill"], fleet["decode"]], router=PD) as router:
        router.wait_fresh(["prefill", "decode"])
        status, answer, headers = router.post("/v1/completions", body(prompt(88, 2100)))
        assert status == 400, answer
        assert answer["error"]["param"] == "prompt"
        assert "maximum context length is 2048" in answer["error"]["message"]
        assert "x-loom-pd-fallback" not in headers
        status, answer, _ = router.post("/v1/completions", body(prompt(89, 2040), max_tokens=16))
        assert status == 400 and answer["error"]["param"] == "max_tokens", answer
        status, answer, _ = router.post("/v1/completions", body(prompt(90, 100), max_tokens=0))
        assert status == 400 and answer["error"]["param"] == "max_tokens", answer
        assert router.metric("loom_router:pd_fallbacks_total", reason="status") == 0
        assert router.metric("loom_router:pd_total", mode="remote-prefill") == 0
    assert fleet["prefill"].proc.pool_whole()  # no lease waits for a decode that never came


def test_logit_bias_through_pd_is_the_aggregated_answer(
    fleet: dict[str, Any], launch_router: Any
) -> None:
    """The decode samples every token the client sees, with the client's logit_bias."""
    ids, bias = prompt(5, 300), {"logit_bias": {"42": 100}}
    status, want, _ = post(fleet["reference"].url + "/v1/completions", body(ids, **bias))
    assert status == 200, want
    with launch_router([fleet["prefill"], fleet["decode"]], router=PD) as router:
        router.wait_fresh(["prefill", "decode"])
        status, answer, headers = router.post("/v1/completions", body(ids, **bias))
    assert status == 200 and headers["x-loom-pd"] == "remote-prefill", answer
    assert answer["choices"][0]["text"] == want["choices"][0]["text"]
    assert answer["choices"][0]["logprobs"]["tokens"] == want["choices"][0]["logprobs"]["tokens"]
    assert len(set(want["choices"][0]["logprobs"]["tokens"])) == 1  # token 42, eight times


def test_a_list_of_prompts_through_pd_is_prefilled_by_the_decode(
    fleet: dict[str, Any], launch_router: Any
) -> None:
    """One KV lease answers one prompt: a list (one choice each) is prefilled where it is
    decoded, and says so."""
    prompts = [prompt(6, 300), prompt(7, 200)]
    status, want, _ = post(fleet["reference"].url + "/v1/completions", body(prompts))  # type: ignore[arg-type]
    assert status == 200, want
    with launch_router([fleet["prefill"], fleet["decode"]], router=PD) as router:
        router.wait_fresh(["prefill", "decode"])
        status, answer, headers = router.post("/v1/completions", body(prompts))  # type: ignore[arg-type]
        assert router.metric("loom_router:pd_total", mode="remote-prefill") == 0
    assert status == 200 and headers["x-loom-pd"] == "local-prefill", answer
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    got = [c["logprobs"]["tokens"] for c in answer["choices"]]
    assert got == [c["logprobs"]["tokens"] for c in want["choices"]]


@pytest.mark.parametrize(
    "asks",
    [{"echo": True, "max_tokens": 1}, {"prompt_logprobs": 2}],
    ids=["echo-logprobs", "prompt_logprobs"],
)
def test_prompt_logprobs_through_pd_are_prefilled_by_the_decode(
    fleet: dict[str, Any], launch_router: Any, asks: dict[str, Any]
) -> None:
    """Prompt log-probs come from the worker that prefills the prompt: the router prefills such
    a request where it decodes (a long prompt that would otherwise go to the prefill), says so,
    and the client gets the aggregated worker's numbers."""
    ids = prompt(8, 300)
    status, want, _ = post(fleet["reference"].url + "/v1/completions", body(ids, **asks))
    assert status == 200, want
    with launch_router([fleet["prefill"], fleet["decode"]], router=PD) as router:
        router.wait_fresh(["prefill", "decode"])
        status, answer, headers = router.post("/v1/completions", body(ids, **asks))
        assert router.metric("loom_router:pd_total", mode="remote-prefill") == 0
    assert status == 200 and headers["x-loom-pd"] == "local-prefill", answer
    got, ref = answer["choices"][0], want["choices"][0]
    assert got["text"] == ref["text"]
    assert got["logprobs"]["tokens"] == ref["logprobs"]["tokens"]
    assert got["logprobs"]["token_logprobs"] == ref["logprobs"]["token_logprobs"]
    assert got.get("prompt_logprobs") == ref.get("prompt_logprobs")
    if "echo" in asks:
        assert len(got["logprobs"]["tokens"]) == len(ids) + 1
        assert got["logprobs"]["token_logprobs"][0] is None
    else:
        assert len(got["prompt_logprobs"]) == len(ids) and got["prompt_logprobs"][0] is None


def test_n_choices_through_pd_pull_the_prompt_once_and_equal_the_aggregated_answer(
    fleet: dict[str, Any], launch_router: Any
) -> None:
    """n > 1: the prefill runs the prompt once (n is not its business), the decode's first
    sample pulls it and the others take it from the prefix cache; seeded, every choice equals
    the aggregated worker's."""
    ids = prompt(91, 300)
    asks = {"n": 3, "seed": 17, "temperature": 1.0}
    status, want, _ = post(fleet["reference"].url + "/v1/completions", body(ids, **asks))
    assert status == 200, want
    pulled = "loom:kv_pulled_tokens_total"
    before = fleet["decode"].counter(pulled)
    with launch_router([fleet["prefill"], fleet["decode"]], router=PD) as router:
        router.wait_fresh(["prefill", "decode"])
        status, answer, headers = router.post("/v1/completions", body(ids, **asks))
    assert status == 200 and headers["x-loom-pd"] == "remote-prefill", answer
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    got = [c["logprobs"]["tokens"] for c in answer["choices"]]
    assert got == [c["logprobs"]["tokens"] for c in want["choices"]]
    assert len({tuple(t) for t in got}) > 1
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]  # the decode's own hits
    assert fleet["decode"].counter(pulled) - before == len(ids) - 1 - cached  # one pull, not 3
    assert answer["usage"]["prompt_tokens"] == len(ids)


def test_chat_prompt_logprobs_through_pd_are_prefilled_by_the_decode(
    fleet: dict[str, Any], launch_router: Any
) -> None:
    """A chat asking for prompt_logprobs (long enough to go to the prefill otherwise) is
    prefilled where it is decoded, and its numbers are the aggregated worker's."""
    words = " ".join(f"w{i}" for i in range(200))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 2,
            "temperature": 0, "prompt_logprobs": 1}  # fmt: skip
    status, want, _ = post(fleet["reference"].url + "/v1/chat/completions", chat)
    assert status == 200, want
    with launch_router([fleet["prefill"], fleet["decode"]], router=PD) as router:
        router.wait_fresh(["prefill", "decode"])
        status, answer, headers = router.post("/v1/chat/completions", chat)
        assert router.metric("loom_router:pd_total", mode="remote-prefill") == 0
    assert status == 200 and headers["x-loom-pd"] == "local-prefill", answer
    assert answer["prompt_logprobs"] == want["prompt_logprobs"]
    assert len(answer["prompt_logprobs"]) > 64
