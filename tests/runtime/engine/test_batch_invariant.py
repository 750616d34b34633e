"""An engine in batch-invariant mode (`batch_invariant`, `--batch-invariant`; the llama and
sparse-mla families here): a request's
tokens and the log-probs of its sampled tokens are the same bits run alone and batched with
others, with its prompt prefilled whole or in chunks, and from a prefix-cache hit (in float32,
where torch's own matmuls and attention differ in the last bits with each) — what an RL
trainer's exact importance ratio needs of a loaded server. Refused where not built."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import torch
from tests.runtime.engine.invariance_helpers import Records, serve_waves

from loom_runtime.card import families
from loom_runtime.card.families import Family
from loom_runtime.engine.build import choose_invariance
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.ranks.channel import EngineRanks
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.models.causal_lm import CausalLM
from loom_runtime.models.linear import invariant_linear, plain_linear
from loom_runtime.models.llama import LlamaForCausalLM
from loom_runtime.models.loader import LoadedModel, load_model


def requests() -> list[EngineRequest]:
    prompts = [[5, 81, 300, 17, 2048, 9, 44, 12], [12, 900, 33], [600, 601, 602, 603, 7], [40]]
    return [
        EngineRequest(
            f"r{i}",
            tuple(p),
            SamplingParams(max_tokens=12, temperature=0.8, seed=i, logprobs=0, ignore_eos=True),
        )
        for i, p in enumerate(prompts)
    ]


def run(
    loaded: LoadedModel,
    batch: Sequence[EngineRequest],
    invariant: bool,
    budget: int = 2048,
    rounds: int = 1,
) -> list[Records]:
    """Each request's (token, log-prob) pairs, the batch run together in one engine with a step
    budget of `budget` tokens; `rounds` times over, a later round's prompts then cached."""
    config = EngineConfig(
        dtype=torch.float32, max_model_len=64, num_blocks=32, batch_invariant=invariant,
        max_num_batched_tokens=budget, max_num_seqs=4,
    )  # fmt: skip
    return serve_waves(Engine(loaded, config), [batch] * rounds)


@pytest.fixture(params=["llama", "sparse-mla"])
def checkpoint(request: pytest.FixtureRequest) -> Path:
    """Each family with a batch-invariant mode (the mot family: test_denoise_lane.py)."""
    name = "tiny_dir" if request.param == "llama" else "sparse_dir"
    path: Path = request.getfixturevalue(name)
    return path


def test_tokens_and_logprobs_are_the_same_bits_alone_and_batched(checkpoint: Path) -> None:
    loaded = load_model(checkpoint, dtype=torch.float32)  # its own: this test sets its matmuls
    (together,) = run(loaded, requests(), invariant=True)
    for req in requests():
        (alone,) = run(loaded, [req], invariant=True)
        assert len(alone[req.request_id]) == 12, req.request_id
        assert together[req.request_id] == alone[req.request_id], req.request_id


def long_prompts() -> list[EngineRequest]:
    """Two 49-token prompts, sampled: from the prefix cache, only the last token is computed
    (as a decode step)."""
    return [
        EngineRequest(
            f"long{i}",
            tuple((t * 37 + 11 * i) % 3000 + 5 for t in range(49)),
            SamplingParams(max_tokens=8, temperature=0.8, seed=i, logprobs=0, ignore_eos=True),
        )
        for i in range(2)
    ]


def test_a_prompt_in_chunks_or_from_the_prefix_cache_is_the_same_bits(checkpoint: Path) -> None:
    loaded = load_model(checkpoint, dtype=torch.float32)
    whole, cached = run(loaded, long_prompts(), invariant=True, rounds=2)
    assert all(len(r) == 8 for r in whole.values())
    assert cached == whole  # the second round's prompts hit the prefix cache
    (chunked,) = run(loaded, long_prompts(), invariant=True, budget=12)  # chunks of ≤ 12 tokens
    assert chunked == whole


def test_an_engine_sets_its_models_matmuls_either_way(tiny_dir: Path) -> None:
    loaded = load_model(tiny_dir, dtype=torch.float32)
    model = loaded.model
    assert isinstance(model, LlamaForCausalLM)
    run(loaded, requests()[:1], invariant=True)
    assert model.linear is invariant_linear
    assert all(layer.linear is invariant_linear for layer in model.layers)
    assert all(layer.invariant_attention for layer in model.layers)
    run(loaded, requests()[:1], invariant=False)  # engines sharing a model set it each time
    assert model.linear is plain_linear
    assert all(layer.linear is plain_linear for layer in model.layers)
    assert not any(layer.invariant_attention for layer in model.layers)


def test_batch_invariant_is_refused_where_it_is_not_built(
    sparse64: LoadedModel, tiny64: LoadedModel
) -> None:
    config = EngineConfig(dtype=torch.float64, max_model_len=64, num_blocks=16)
    with pytest.raises(ValueError, match="not built with MTP speculation"):
        replace(config, batch_invariant=True, mtp_draft_tokens=1)
    with pytest.raises(ValueError, match="not built with HiSparse"):
        replace(config, batch_invariant=True, hisparse_host_pool_gib=0.1)
    ranks = cast(EngineRanks, object())
    built = "llama, sparse-mla, mot families in one process or on TP ranks"
    with pytest.raises(ValueError, match=f"{built}, not for PCP/DCP/EP/DP ranks"):
        choose_invariance(sparse64.model, True, ranks)
    plugin = Family(name="plain-plugin", model_types=("plain_plugin",), loops=("ar_decode",),
                    runtime=object())  # fmt: skip
    model = cast(CausalLM, SimpleNamespace(config=SimpleNamespace(model_type="plain_plugin")))
    with families.registered(plugin):
        with pytest.raises(ValueError, match=f"{built}, not for the 'plain-plugin' family"):
            choose_invariance(model, True, None)
        choose_invariance(model, False, None)  # off: nothing to set, nothing refused
