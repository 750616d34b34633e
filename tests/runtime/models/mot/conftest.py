"""Fixtures for the MoT tests: a MoT checkpoint with weights large enough that no term hides
(N(0, 0.08)), our model loaded from it, and the plain float64 reference over the same tensors."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runtime.models.mot.reference import ReferenceMot

from loom_runtime.models.loader import load_model, read_weights
from loom_runtime.models.mot.model import MotForCausalLM
from loom_runtime.models.mot.tiny import write_mot_checkpoint

PARITY_STD = 0.08


@pytest.fixture(scope="session")
def mot_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Mapping[str, Any]]:
    """(directory, config.json) of a 2-layer MoT with GQA and 3 latent channels, patch 2."""
    return write_mot_checkpoint(
        tmp_path_factory.mktemp("mot") / "parity",
        seed=3,
        std=PARITY_STD,
        num_hidden_layers=2,
        image={"latent_channels": 3, "patch_size": 2, "frequency_dim": 32},
    )


@pytest.fixture(scope="session")
def mot64(mot_checkpoint: tuple[Path, Mapping[str, Any]]) -> MotForCausalLM:
    model = load_model(mot_checkpoint[0], dtype=torch.float64).model
    assert isinstance(model, MotForCausalLM)
    return model


@pytest.fixture(scope="session")
def reference(mot_checkpoint: tuple[Path, Mapping[str, Any]]) -> ReferenceMot:
    path, config = mot_checkpoint
    return ReferenceMot(read_weights(path), config)
