"""Fixtures for the model tests: the tiny checkpoint, transformers-made checkpoints, and a paged
sequence driver that plays the engine's part (block tables, slots, ForwardBatch)."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runtime.models.paged_batch import paged_batch

from loom_runtime.kv.cache import PagedKVCache
from loom_runtime.models.causal_lm import CausalLM
from loom_runtime.models.tiny import init_tiny

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
PARITY_VOCAB = 4224  # >= the tiny tokenizer's vocabulary, whose files the parity checkpoints reuse


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("tiny") / "tiny")


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (norm weights around 1, biases non-zero) so no term is invisible."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            base = 1.0 if name.endswith("norm.weight") else 0.0
            param.copy_(base + 0.1 * noise)


@pytest.fixture
def hf_checkpoint(tiny_dir: Path, tmp_path: Path) -> Callable[..., tuple[Any, Path]]:
    """Factory: (transformers model, checkpoint dir) for a family and config overrides."""

    def make(family: str, seed: int = 0, max_shard_size: str | None = None, **overrides: Any):
        import transformers

        classes = {
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        }
        config_cls, model_cls = classes[family]
        fields: dict[str, Any] = {
            "vocab_size": PARITY_VOCAB,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "attn_implementation": "eager",
        }
        fields.update(overrides)
        torch.manual_seed(seed)
        model = model_cls(config_cls(**fields)).eval()
        randomize(model, seed)
        out = tmp_path / f"{family}-{seed}"
        kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
        model.save_pretrained(out, **kwargs)
        for name in TOKENIZER_FILES:
            shutil.copy(tiny_dir / name, out / name)
        return model, out

    return make


class PagedSequences:
    """Test double of the engine's KV manager + runner: non-contiguous (shuffled) blocks per
    sequence, slot mapping, and one ForwardBatch per step."""

    def __init__(
        self, model: CausalLM, block_size: int = 4, num_blocks: int = 96, seed: int = 0
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.kv = PagedKVCache(model.config.kv_spec(block_size, num_blocks, model.dtype))
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}

    def step(self, chunks: Sequence[tuple[str, Sequence[int]]]) -> dict[str, torch.Tensor]:
        """Run one forward over (sequence, new token ids) chunks; logits of every new token."""
        batch = paged_batch(chunks, self.tables, self.lengths, self.free, self.block_size, False)
        query_start = batch.query_start
        logits = self.model.forward(batch, self.kv)
        return {
            seq: logits[query_start[i] : query_start[i + 1]] for i, (seq, _) in enumerate(chunks)
        }


@pytest.fixture
def paged() -> type[PagedSequences]:
    return PagedSequences
