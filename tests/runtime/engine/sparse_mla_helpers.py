"""What the sparse-mla engine tests share: the one-sequence greedy reference, greedy params, and
running requests on an engine to the end (the float64 checkpoint is conftest's `sparse64`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.causal_lm import SparseMlaCausalLM
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM

Prompt = Callable[[int, int], tuple[int, ...]]


def inner(loaded: LoadedModel) -> SparseMlaForCausalLM:
    assert isinstance(loaded.model, SparseMlaCausalLM)
    return loaded.model.model


def one_sequence(model: SparseMlaForCausalLM, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    """Greedy tokens of the one-sequence forward (the path that equals transformers)."""
    cache = model.new_cache(len(prompt) + n)
    logits = model.forward(torch.tensor(prompt), cache)
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = model.forward(torch.tensor(out[-1:]), cache)
    return tuple(out)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def run_all(engine: Engine, reqs: list[EngineRequest]) -> dict[str, tuple[int, ...]]:
    got = {r.request_id: OutputCollector(r) for r in reqs}
    for r in reqs:
        engine.add_request(r, got[r.request_id])
    for _ in range(10_000):
        if all(c.done.is_set() for c in got.values()):
            return {k: c.result().output_token_ids for k, c in got.items()}
        engine.step()
    raise AssertionError("requests did not finish within 10000 steps")
