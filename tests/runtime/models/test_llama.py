"""The llama family over the paged KV cache equals transformers, and batching changes nothing."""

from __future__ import annotations

import pytest
import torch

from loom_runtime.errors import CheckpointError
from loom_runtime.models.loader import load_model, read_weights

TOL = 1e-4
DECODE_STEPS = 32

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
VARIANTS = {
    "llama": ("llama", {}),
    "llama-rope-llama3-biases": (
        "llama",
        {"rope_scaling": LLAMA3_ROPE, "attention_bias": True, "mlp_bias": True},
    ),
    "llama-rope-linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.5}}),
    "llama-rope-yarn": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "mistral": ("mistral", {"sliding_window": None}),
    "qwen2-attention-bias": ("qwen2", {}),
    "qwen3-qk-norm-tied": ("qwen3", {"head_dim": 32, "tie_word_embeddings": True}),
}


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_and_32_decode_steps_match_transformers(variant, hf_checkpoint, paged) -> None:
    family, overrides = VARIANTS[variant]
    hf_model, path = hf_checkpoint(family, **overrides)
    model = load_model(path).model
    prompt = torch.randint(0, 4000, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    seqs = paged(model, block_size=4)
    # chunked prefill: the second chunk attends to the first through the paged cache
    first = seqs.step([("a", prompt[:13])])["a"]
    second = seqs.step([("a", prompt[13:])])["a"]
    tokens = list(prompt)
    decode_logits = []
    for _ in range(DECODE_STEPS):
        tokens.append(int((second if not decode_logits else decode_logits[-1]).argmax(-1)[-1]))
        decode_logits.append(seqs.step([("a", [tokens[-1]])])["a"])
    ours = torch.cat([first, second, *decode_logits])
    reference = hf_logits(hf_model, tokens)[: len(tokens)]
    assert ours.shape == (len(prompt) + DECODE_STEPS, reference.shape[-1])
    assert (ours - reference).abs().max().item() < TOL
    assert reference.abs().max().item() > 0.1  # logits are not trivially ~0
    # transformers' greedy choice after each position is the token we generated
    assert reference[len(prompt) - 1 : -1].argmax(-1).tolist() == tokens[len(prompt) :]


def test_mixed_batch_equals_each_sequence_alone(hf_checkpoint, paged) -> None:
    _, path = hf_checkpoint("llama")
    model = load_model(path, dtype=torch.float64).model
    gen = torch.Generator().manual_seed(2)
    history = {
        s: torch.randint(0, 4000, (n,), generator=gen).tolist()
        for s, n in (("b", 9), ("c", 10), ("d", 4))
    }
    step = [("c", [11]), ("a", [5, 6, 7, 8, 9, 10, 12]), ("d", [13]), ("b", [1, 2, 3, 4, 5, 6])]

    together = paged(model, seed=1)
    together.step(list(history.items()))
    mixed = together.step(step)

    alone = {}
    for seq, new in step:
        runner = paged(model, seed=3)
        if seq in history:
            runner.step([(seq, history[seq])])
        alone[seq] = runner.step([(seq, new)])[seq]
    for seq, _ in step:
        assert mixed[seq].dtype == torch.float64
        assert torch.allclose(mixed[seq], alone[seq], rtol=0, atol=1e-10), seq


def test_decode_batch_with_unequal_lengths_equals_single_decodes(hf_checkpoint, paged) -> None:
    _, path = hf_checkpoint("qwen3", head_dim=32)
    model = load_model(path, dtype=torch.float64).model
    lengths = {"x": 3, "y": 17, "z": 8}
    together = paged(model, seed=4)
    together.step([(s, list(range(1, n + 1))) for s, n in lengths.items()])
    batched = together.step([(s, [42]) for s in lengths])
    for seq, n in lengths.items():
        runner = paged(model, seed=5)
        runner.step([(seq, list(range(1, n + 1)))])
        single = runner.step([(seq, [42])])[seq]
        assert torch.allclose(batched[seq], single, rtol=0, atol=1e-10), seq


def test_bf16_model_returns_float32_logits_close_to_float32_model(hf_checkpoint, paged) -> None:
    _, path = hf_checkpoint("llama")
    full = paged(load_model(path).model).step([("a", [1, 2, 3, 4, 5])])["a"]
    half = paged(load_model(path, dtype=torch.bfloat16).model).step([("a", [1, 2, 3, 4, 5])])["a"]
    assert half.dtype == torch.float32
    assert (half - full).abs().max().item() < 0.1 * full.abs().max().item()


def test_load_state_swaps_weights_in_place(hf_checkpoint, paged) -> None:
    _, path_a = hf_checkpoint("llama", seed=0)
    _, path_b = hf_checkpoint("llama", seed=1)
    model = load_model(path_a).model
    before = paged(model).step([("a", [1, 2, 3])])["a"]
    model.load_state(read_weights(path_b))
    after = paged(model).step([("a", [1, 2, 3])])["a"]
    expected = paged(load_model(path_b).model).step([("a", [1, 2, 3])])["a"]
    assert not torch.allclose(before, after)
    assert torch.equal(after, expected)


def test_load_state_rejects_bad_tensors_without_changing_anything(hf_checkpoint, paged) -> None:
    _, path = hf_checkpoint("llama")
    model = load_model(path).model
    before = paged(model).step([("a", [1, 2, 3])])["a"]
    tensors = read_weights(path)
    bad = {name: t + 1 for name, t in tensors.items()}
    bad["model.norm.weight"] = torch.ones(7)
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight"):
        model.load_state(bad)
    with pytest.raises(CheckpointError, match=r"unknown: model\.extra"):
        model.load_state({**tensors, "model.extra": torch.ones(1)})
    missing = dict(tensors)
    del missing["lm_head.weight"]
    with pytest.raises(CheckpointError, match=r"missing: lm_head\.weight"):
        model.load_state(missing)
    assert torch.equal(paged(model).step([("a", [1, 2, 3])])["a"], before)


def test_partial_load_state_updates_only_named_tensors(hf_checkpoint, paged) -> None:
    _, path = hf_checkpoint("llama")
    model = load_model(path).model
    before = paged(model).step([("a", [1, 2, 3])])["a"]
    model.load_state({"lm_head.weight": torch.zeros(4224, 64)}, strict=False)
    after = paged(model).step([("a", [1, 2, 3])])["a"]
    assert not torch.equal(before, after)
    assert torch.count_nonzero(after) == 0
