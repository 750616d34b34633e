"""The C2 parity gate: in float64, the behaviour log-prob a worker reports for every sampled token
equals a plain forward of the same weights on the same sequence within 1e-9 — transformers'
training forward for the tiny llama, Loom's own model on one plain sequence (no paging, no
batching) for the tiny sparse-mla — at temperature 1 (where it is the raw log_softmax, the
`logprobs` field's value too) and at temperature 0.7 (log_softmax(logits / 0.7)), streamed and
not, on both routes; and for the llama on two tensor-parallel ranks (its logits all-reduced
across them). Each request is served alone: sparse-mla's float32 expert routing moves its
log-probs ~1e-7 in a batch (docs/rl.md) — except on a worker in batch-invariant mode, whose
concurrent requests each hold the gate against the same model's forward in that mode."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tests.runtime.training_forward import llama_logits, sampled_logprobs, sparse_mla_logits

from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.testing.processes import sse_events

GATE = 1e-9
MAX_TOKENS = 12
SPARSE_PROMPT = [10 + (7 * i) % 3000 for i in range(100)]  # longer than index_topk (64)


@pytest.fixture(scope="module")
def llama(launch: Any, tiny_v1: Path) -> Iterator[Any]:
    with launch(tiny_v1, "--dtype", "float64") as w:
        yield w


@pytest.fixture(scope="module")
def llama_tp2(launch: Any, tiny_v1: Path) -> Iterator[Any]:
    with launch(tiny_v1, "--dtype", "float64", "--tp", "2") as w:
        yield w


@pytest.fixture(scope="module")
def sparse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_sparse_mla(tmp_path_factory.mktemp("c2-sparse") / "tiny")


@pytest.fixture(scope="module")
def sparse(launch: Any, sparse_dir: Path) -> Iterator[Any]:
    with launch(sparse_dir, "--dtype", "float64") as w:
        yield w


@pytest.fixture(scope="module")
def sparse_invariant(launch: Any, sparse_dir: Path) -> Iterator[Any]:
    with launch(sparse_dir, "--dtype", "float64", "--batch-invariant") as w:
        yield w


def completion(worker: Any, prompt: Any, temperature: float, seed: int) -> dict[str, Any]:
    body = {"model": worker.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "seed": seed,
            "temperature": temperature, "ignore_eos": True, "return_behaviour": True,
            "logprobs": 0}  # fmt: skip
    status, answer, _ = worker.post("/v1/completions", body)
    assert status == 200, answer
    return dict(answer["choices"][0])


def streamed_chat(
    worker: Any, temperature: float, seed: int
) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, output ids, behaviour log-probs) of a streamed chat with the record."""
    body = {"model": worker.model, "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": MAX_TOKENS, "seed": seed, "temperature": temperature,
            "ignore_eos": True, "return_behaviour": True, "stream": True}  # fmt: skip
    events = sse_events(worker.base_url + "/v1/chat/completions", body)
    prompt = next(e["prompt_token_ids"] for e in events if "prompt_token_ids" in e)
    ids: list[int] = []
    lps: list[float] = []
    for e in events:
        for c in e.get("choices", []):
            ids += c.get("token_ids") or []
            lps += (c.get("behaviour") or {}).get("logprobs", [])
    return prompt, ids, lps


def gap(reported: list[float], reference: list[float]) -> float:
    assert len(reported) == len(reference) == MAX_TOKENS
    return max(abs(a - b) for a, b in zip(reported, reference, strict=True))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("worker", ["llama", "llama_tp2"])
def test_llama_completions_log_probs_equal_transformers_forward(
    worker: str, tiny_v1: Path, temperature: float, request: pytest.FixtureRequest
) -> None:
    choice = completion(request.getfixturevalue(worker), "Once upon a time", temperature, seed=11)
    prompt, out = choice["prompt_token_ids"], choice["token_ids"]
    logits = llama_logits(tiny_v1, prompt + out)
    reported = choice["behaviour"]["logprobs"]
    assert gap(reported, sampled_logprobs(logits, len(prompt), out, temperature)) <= GATE
    raw = sampled_logprobs(logits, len(prompt), out)
    assert gap(choice["logprobs"]["token_logprobs"], raw) <= GATE  # `logprobs` stays raw
    if temperature == 1.0:
        assert reported == choice["logprobs"]["token_logprobs"]  # no masking: processed == raw
    else:
        assert gap(reported, raw) > 1e-3  # the record is not the raw log-prob


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_llama_streamed_chat_log_probs_equal_transformers_forward(
    llama: Any, tiny_v1: Path, temperature: float
) -> None:
    prompt, out, reported = streamed_chat(llama, temperature, seed=5)
    logits = llama_logits(tiny_v1, prompt + out)
    assert gap(reported, sampled_logprobs(logits, len(prompt), out, temperature)) <= GATE


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sparse_mla_log_probs_equal_its_plain_one_sequence_forward(
    sparse: Any, sparse_dir: Path, temperature: float
) -> None:
    choice = completion(sparse, SPARSE_PROMPT, temperature, seed=3)
    out = choice["token_ids"]
    assert choice["prompt_token_ids"] == SPARSE_PROMPT
    logits = sparse_mla_logits(sparse_dir, SPARSE_PROMPT + out, len(SPARSE_PROMPT))
    reference = sampled_logprobs(logits, len(SPARSE_PROMPT), out, temperature)
    assert gap(choice["behaviour"]["logprobs"], reference) <= GATE


def test_sparse_mla_log_probs_hold_the_gate_in_a_batch_in_batch_invariant_mode(
    sparse_invariant: Any, sparse_dir: Path
) -> None:
    """Four requests at once (different prompts, lengths and seeds), batched in the worker's
    steps: each one's log-probs equal a trainer's forward of its whole sequence in the same
    mode within the gate (without the mode, the batch moves them ~1e-7: checked)."""
    prompts = [[*SPARSE_PROMPT[: 60 + 9 * i], 7 + i] for i in range(4)]  # past index_topk
    with ThreadPoolExecutor(len(prompts)) as pool:
        choices = list(pool.map(
            lambda i: completion(sparse_invariant, prompts[i], 1.0, seed=20 + i), range(4)
        ))  # fmt: skip
    for prompt, choice in zip(prompts, choices, strict=True):
        out = choice["token_ids"]
        logits = sparse_mla_logits(sparse_dir, prompt + out, len(prompt), batch_invariant=True)
        reference = sampled_logprobs(logits, len(prompt), out, 1.0)
        assert gap(choice["behaviour"]["logprobs"], reference) <= GATE, prompt
