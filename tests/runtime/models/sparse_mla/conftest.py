"""Fixtures for the sparse-mla tests: the tiny checkpoint, our float64 model of it, the
transformers reference (GlmMoeDsaForCausalLM) loaded from the same directory, and a prompt."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from loom_runtime.models.sparse_mla.loader import LoadedSparseMla, load_sparse_mla
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.models.tiny_tokenizer import corpus_text

PROMPT_TOKENS = 300  # a few hundred: well past the tiny index_topk (64)


@pytest.fixture(scope="session")
def sparse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_sparse_mla(tmp_path_factory.mktemp("sparse-mla") / "tiny")


@pytest.fixture(scope="session")
def ours(sparse_dir: Path) -> LoadedSparseMla:
    return load_sparse_mla(sparse_dir, dtype=torch.float64)


@pytest.fixture(scope="session")
def reference(sparse_dir: Path) -> Any:
    """transformers' GlmMoeDsaForCausalLM in float64 (eager experts: grouped_mm lacks float64)."""
    from transformers import GlmMoeDsaForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)  # it reports the MTP layer's tensors as unexpected
    try:
        model = GlmMoeDsaForCausalLM.from_pretrained(
            sparse_dir, dtype=torch.float64, experts_implementation="eager"
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.eval()


@pytest.fixture(scope="session")
def prompt(ours: LoadedSparseMla) -> torch.Tensor:
    """PROMPT_TOKENS ids of the shipped corpus, through the checkpoint's own tokenizer."""
    ids = ours.tokenizer.encode(corpus_text())[:PROMPT_TOKENS]
    assert len(ids) == PROMPT_TOKENS
    return torch.tensor(ids, dtype=torch.long)
