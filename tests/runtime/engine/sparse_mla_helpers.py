"""What the sparse-mla engine tests share: the one-sequence greedy reference, greedy params,
running requests on an engine to the end, the planner's shape of the checkpoint and a spy on an
engine's MTP drafts (the float64 checkpoint is conftest's `sparse64`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from loom_operator.fleet.kv_layout import Indexer, KVDtype, MLAAttention, ModelShape
from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.ranks.ranked_runner import RankedRunner
from loom_runtime.engine.runner import TokenWork
from loom_runtime.engine.spec.mtp_runner import Drafter, MtpRunner
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.loader import LoadedModel
from loom_runtime.models.sparse_mla.causal_lm import SparseMlaCausalLM
from loom_runtime.models.sparse_mla.config import SparseMlaConfig
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


def planner_shape(loaded: LoadedModel, kv_dtype: KVDtype, group: int = 128) -> ModelShape:
    """The planner's shape of the loaded tiny sparse-mla model (its KV figures to compare)."""
    c = loaded.config
    assert isinstance(c, SparseMlaConfig)
    return ModelShape(
        num_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        attention=MLAAttention(c.kv_lora_rank, c.qk_rope_head_dim),
        kv_dtype=kv_dtype,
        quant_group_size=group,
        indexer=Indexer(
            len(c.full_indexer_layers), c.index_head_dim, c.index_topk, c.index_n_heads
        ),
    )


class RecordingDrafter:
    """Spy on the engine's MTP drafts: delegates to the runner, records (start, drafts)."""

    def __init__(self) -> None:
        self.runner: Drafter | None = None
        self.seen: dict[str, dict[int, tuple[int, ...]]] = {}

    def watch(self, engine: Engine) -> None:
        """Delegate to this engine's MTP runner, on one rank or on its ranks (built with this
        spy as its drafter)."""
        runner = engine._runner  # the engine builds it; the spy needs the real proposals
        assert isinstance(runner, MtpRunner | RankedRunner)
        self.runner = runner

    def propose(self, works: Sequence[TokenWork]) -> list[tuple[int, ...]]:
        assert self.runner is not None
        out = self.runner.propose(works)
        for w, d in zip(works, out, strict=True):
            if d:
                self.seen.setdefault(w.request_id, {})[w.start] = d
        return out
