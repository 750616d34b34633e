"""SparseMlaForCausalLM == transformers' GlmMoeDsaForCausalLM on the tiny checkpoint: a full
prefill, 32 cached greedy decode steps, chunked prefill; and the indexer's choice matters."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from loom_runtime.errors import CheckpointError
from loom_runtime.models.loader import read_weights
from loom_runtime.models.sparse_mla.loader import LoadedSparseMla, load_sparse_mla
from loom_runtime.models.sparse_mla.model import SparseMlaForCausalLM

TOLERANCE = 1e-4
DECODE_STEPS = 32


def test_prefill_logits_equal_transformers_with_topk_below_the_context(
    ours: LoadedSparseMla, reference: Any, prompt: torch.Tensor
) -> None:
    assert ours.config.index_topk < len(prompt)
    logits = ours.model.forward(prompt, ours.model.new_cache(len(prompt)))
    with torch.no_grad():
        expected = reference(prompt[None]).logits[0]
    assert logits.dtype == torch.float64
    assert (logits - expected).abs().max().item() < TOLERANCE


def test_greedy_decode_with_the_cache_equals_transformers(
    ours: LoadedSparseMla, reference: Any, prompt: torch.Tensor
) -> None:
    from transformers import DynamicCache

    cache = ours.model.new_cache(len(prompt) + DECODE_STEPS)
    past = DynamicCache(config=reference.config)
    logits = ours.model.forward(prompt, cache)[-1]
    with torch.no_grad():
        expected = reference(prompt[None], past_key_values=past, use_cache=True).logits[0, -1]
    tokens, expected_tokens = [], []
    for _ in range(DECODE_STEPS):
        assert (logits - expected).abs().max().item() < TOLERANCE
        token, expected_token = int(logits.argmax()), int(expected.argmax())
        tokens.append(token)
        expected_tokens.append(expected_token)
        logits = ours.model.forward(torch.tensor([token]), cache)[0]
        with torch.no_grad():
            step = torch.tensor([[expected_token]])
            expected = reference(step, past_key_values=past, use_cache=True).logits[0, -1]
    assert tokens == expected_tokens
    assert cache.length == len(prompt) + DECODE_STEPS
    assert len(set(tokens)) > 1  # a real sequence, not one token repeated


def test_chunked_prefill_equals_one_prefill(ours: LoadedSparseMla, prompt: torch.Tensor) -> None:
    whole = ours.model.forward(prompt, ours.model.new_cache(len(prompt)))
    cache = ours.model.new_cache(len(prompt))
    bounds = [0, 100, 101, 250, len(prompt)]
    parts = [ours.model.forward(prompt[a:b], cache) for a, b in itertools.pairwise(bounds)]
    # not bit-equal: the indexer scores and the router run in float32, in other matmul shapes
    assert torch.allclose(torch.cat(parts), whole, rtol=0, atol=1e-6)


def test_the_indexer_choice_changes_logits_only_past_topk(
    ours: LoadedSparseMla, sparse_dir: Path, prompt: torch.Tensor
) -> None:
    dense_config = dataclasses.replace(ours.config, index_topk=len(prompt))
    dense = SparseMlaForCausalLM(dense_config, dtype=torch.float64)
    dense.load_state(read_weights(sparse_dir))
    sparse = ours.model.forward(prompt, ours.model.new_cache(len(prompt)))
    full = dense.forward(prompt, dense.new_cache(len(prompt)))
    k = ours.config.index_topk
    assert torch.allclose(sparse[:k], full[:k], rtol=0, atol=1e-10)  # k rows: all are selected
    assert (sparse[k:] - full[k:]).abs().max().item() > 100 * TOLERANCE


def test_the_mtp_layer_weights_are_loaded_and_kept(ours: LoadedSparseMla, sparse_dir: Path) -> None:
    tensors = read_weights(sparse_dir)
    mtp = f"model.layers.{ours.config.num_hidden_layers}"
    assert ours.config.num_nextn_predict_layers == len(ours.model.mtp) == 1
    layer = ours.model.mtp[0]
    assert torch.equal(layer.eh_proj, tensors[f"{mtp}.eh_proj.weight"].double())
    assert torch.equal(
        layer.decoder.indexer.wk if layer.decoder.indexer else torch.empty(0),
        tensors[f"{mtp}.self_attn.indexer.wk.weight"].double(),
    )
    assert torch.equal(layer.head, tensors[f"{mtp}.shared_head.head.weight"].double())


def test_a_checkpoint_missing_a_tensor_is_refused_naming_it(
    sparse_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in sparse_dir.iterdir():
        if file.name != "model.safetensors":
            (broken / file.name).write_bytes(file.read_bytes())
    tensors = load_file(str(sparse_dir / "model.safetensors"))
    del tensors["model.layers.2.self_attn.indexer.k_norm.bias"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"missing: model\.layers\.2\.self_attn\.indexer\.k_norm"
    ):
        load_sparse_mla(broken)


def test_a_forward_past_the_cache_capacity_is_refused(ours: LoadedSparseMla) -> None:
    cache = ours.model.new_cache(8)
    ours.model.forward(torch.arange(6), cache)
    with pytest.raises(ValueError, match="holds 8 tokens; 6 cached"):
        ours.model.forward(torch.arange(3), cache)
    assert cache.length == 6
