"""The MoT's text loop over the paged KV equals transformers' LlamaForCausalLM on the same
weights (its llama-named tensors): logits of a chunked prefill and greedy decode steps."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from loom_runtime.models.loader import load_model, read_weights
from loom_runtime.models.mot.model import IMAGE_PREFIX, MotForCausalLM

DECODE_STEPS = 24
LLAMA_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "attention_bias",
    "mlp_bias",
    "tie_word_embeddings",
)


def transformers_llama(path: Path, config: Mapping[str, Any], dtype: torch.dtype) -> Any:
    """transformers' LlamaForCausalLM holding the checkpoint's text tensors (all but image.*)."""
    import transformers

    fields = {name: config[name] for name in LLAMA_FIELDS}
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**fields, attn_implementation="eager")
    )
    text = {n: t for n, t in read_weights(path).items() if not n.startswith(IMAGE_PREFIX)}
    hf.load_state_dict(text, strict=True)
    return hf.to(dtype).eval()


def run_ar(model: MotForCausalLM, paged: Any, prompt: list[int]) -> tuple[torch.Tensor, list[int]]:
    """Chunked prefill (two chunks over 4-token blocks) then greedy decode steps: every
    position's logits and the tokens (prompt + generated)."""
    seqs = paged(model, block_size=4)
    logits = [seqs.step([("a", prompt[:9])])["a"], seqs.step([("a", prompt[9:])])["a"]]
    tokens = list(prompt)
    for _ in range(DECODE_STEPS):
        tokens.append(int(logits[-1][-1].argmax()))
        logits.append(seqs.step([("a", [tokens[-1]])])["a"])
    return torch.cat(logits), tokens


def test_text_loop_equals_transformers_llama_in_float32(mot_checkpoint, paged) -> None:
    path, config = mot_checkpoint
    model = load_model(path).model
    assert isinstance(model, MotForCausalLM)
    prompt = torch.randint(0, 4000, (19,), generator=torch.Generator().manual_seed(5)).tolist()
    ours, tokens = run_ar(model, paged, prompt)
    with torch.no_grad():
        hf = transformers_llama(path, config, torch.float32)
        reference = hf(torch.tensor([tokens])).logits[0]
    assert ours.shape == (len(tokens), config["vocab_size"])
    assert (ours - reference).abs().max().item() < 1e-4
    assert reference.abs().max().item() > 0.5  # the logits are not trivially ~0
    assert reference[len(prompt) - 1 : -1].argmax(-1).tolist() == tokens[len(prompt) :]


def test_text_loop_equals_transformers_llama_in_float64(mot_checkpoint, mot64, paged) -> None:
    path, config = mot_checkpoint
    prompt = torch.randint(0, 4000, (14,), generator=torch.Generator().manual_seed(6)).tolist()
    ours, tokens = run_ar(mot64, paged, prompt)
    with torch.no_grad():
        reference = transformers_llama(path, config, torch.float64)(torch.tensor([tokens])).logits[
            0
        ]
    assert ours.dtype == torch.float64
    # RoPE's cos/sin are made in float32 on both sides (rounded differently): ~1e-6, not 1e-12
    assert (ours - reference).abs().max().item() < 1e-5
    assert reference[len(prompt) - 1 : -1].argmax(-1).tolist() == tokens[len(prompt) :]
