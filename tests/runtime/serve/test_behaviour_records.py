"""Behaviour records on a live worker: off by default; asked for with `return_behaviour`, each
choice carries its token ids, vLLM's weight_versions and Loom's `behaviour` (seed, one log-prob
per output token), on /v1/completions and /v1/chat/completions, streamed (each chunk its own
tokens' log-probs, the spans on the last) exactly as non-streamed; an unseeded request's reported
seed reproduces its record; a bad value is a 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from loom_runtime.testing.processes import sse_events

MAX_TOKENS = 8
ROUTES = {
    "/v1/completions": {"prompt": "Once upon a time"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hello there"}]},
}


@pytest.fixture(scope="module")
def worker(launch: Any, tiny_v1: Any) -> Iterator[Any]:
    with launch(tiny_v1) as w:
        yield w


def body(worker: Any, path: str, **extra: Any) -> dict[str, Any]:
    return {"model": worker.model, "max_tokens": MAX_TOKENS, "ignore_eos": True,
            **ROUTES[path], **extra}  # fmt: skip


def whole(worker: Any, path: str, **extra: Any) -> dict[str, Any]:
    status, answer, _ = worker.post(path, body(worker, path, **extra))
    assert status == 200, answer
    return dict(answer)


def streamed(worker: Any, path: str, **extra: Any) -> dict[str, Any]:
    """The streamed record, gathered: ids, log-probs, seeds seen, and where the spans came."""
    events = sse_events(worker.base_url + path, body(worker, path, **extra))
    choices = [c for e in events for c in e.get("choices", [])]
    with_spans = [i for i, c in enumerate(choices) if "weight_versions" in c]
    records = [c["behaviour"] for c in choices if "behaviour" in c]
    return {
        "token_ids": [t for c in choices for t in c.get("token_ids") or []],
        "logprobs": [lp for r in records for lp in r["logprobs"]],
        "seeds": {r["seed"] for r in records},
        "spans": choices[with_spans[-1]]["weight_versions"] if with_spans else None,
        "spans_at": with_spans,
        "last": len(choices) - 1,
    }


@pytest.mark.parametrize("path", list(ROUTES))
def test_the_record_is_off_by_default(worker: Any, path: str) -> None:
    choice = whole(worker, path, seed=1)["choices"][0]
    assert "behaviour" not in choice and "weight_versions" not in choice
    assert "token_ids" not in choice


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_whole_answer_carries_ids_versions_seed_and_a_log_prob_per_token(
    worker: Any, path: str
) -> None:
    answer = whole(worker, path, seed=42, temperature=0.9, return_behaviour=True)
    choice = answer["choices"][0]
    assert len(choice["token_ids"]) == MAX_TOKENS
    assert (answer if path.endswith("chat/completions") else choice)["prompt_token_ids"]
    assert choice["weight_versions"] == [{"version": "v1", "start": 0, "end": MAX_TOKENS}]
    assert choice["behaviour"]["seed"] == 42
    lps = choice["behaviour"]["logprobs"]
    assert len(lps) == MAX_TOKENS and all(lp < 0.0 for lp in lps)


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_stream_carries_the_same_record_chunk_by_chunk(worker: Any, path: str) -> None:
    ask = {"seed": 9, "temperature": 0.8, "top_p": 0.9, "return_behaviour": True}
    choice = whole(worker, path, **ask)["choices"][0]
    got = streamed(worker, path, **ask)
    assert got["token_ids"] == choice["token_ids"]
    assert got["logprobs"] == choice["behaviour"]["logprobs"]
    assert got["seeds"] == {9}
    assert got["spans"] == choice["weight_versions"] and got["spans_at"] == [got["last"]]


def test_an_unseeded_requests_reported_seed_reproduces_its_record(worker: Any) -> None:
    path = "/v1/completions"
    first = whole(worker, path, temperature=1.0, return_behaviour=True)["choices"][0]
    seed = first["behaviour"]["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**63
    again = whole(worker, path, temperature=1.0, seed=seed, return_behaviour=True)["choices"][0]
    assert again["token_ids"] == first["token_ids"] and again["behaviour"] == first["behaviour"]


def test_each_of_n_choices_reports_its_own_seed(worker: Any) -> None:
    answer = whole(worker, "/v1/completions", n=2, seed=100, return_behaviour=True)
    assert [c["behaviour"]["seed"] for c in answer["choices"]] == [100, 101]


def test_a_greedy_record_has_no_seed_and_log_probs_of_zero(worker: Any) -> None:
    choice = whole(worker, "/v1/completions", temperature=0, return_behaviour=True)["choices"][0]
    assert choice["behaviour"] == {"seed": None, "logprobs": [0.0] * MAX_TOKENS}


def test_weight_versions_alone_come_without_the_behaviour_object(worker: Any) -> None:
    choice = whole(worker, "/v1/completions", return_weight_versions=True)["choices"][0]
    assert choice["weight_versions"] == [{"version": "v1", "start": 0, "end": MAX_TOKENS}]
    assert "behaviour" not in choice


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_bad_value_is_a_400_naming_the_field(worker: Any, path: str) -> None:
    status, answer, _ = worker.post(path, body(worker, path, return_behaviour="yes"))
    assert status == 400 and answer["error"]["param"] == "return_behaviour"


def test_an_echo_of_the_prompt_alone_has_an_empty_record(worker: Any) -> None:
    choice = whole(worker, "/v1/completions", echo=True, max_tokens=0, return_behaviour=True)
    record = choice["choices"][0]
    assert record["behaviour"]["logprobs"] == [] and record["weight_versions"] == []
