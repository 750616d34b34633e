"""Fixtures for the trainer client's tests against a real `loom up` fleet: two tiny checkpoints
and an environment for child processes (one torch thread each, a private model cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loom_runtime.models.tiny import init_tiny


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny checkpoints: same architecture and tokenizer, different weights."""
    return (
        init_tiny(tmp_path_factory.mktemp("tiny-a"), seed=0),
        init_tiny(tmp_path_factory.mktemp("tiny-b"), seed=1),
    )


@pytest.fixture(scope="session")
def child_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment of child processes: one torch thread, a private LOOM_CACHE."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["LOOM_CACHE"] = str(tmp_path_factory.mktemp("loom-cache"))
    return env
