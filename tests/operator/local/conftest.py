"""Fixtures for the local-substrate tests: tiny checkpoints, card files, and an environment for
child processes (one torch thread each, a private model cache)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loom_operator.testing.cards import card_text
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.models.tiny import init_tiny

CardFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny checkpoints: same architecture and tokenizer, different weights."""
    return (
        init_tiny(tmp_path_factory.mktemp("tiny-a"), seed=0),
        init_tiny(tmp_path_factory.mktemp("tiny-b"), seed=1),
    )


@pytest.fixture(scope="session")
def sparse_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny sparse-mla checkpoint (the sparse examples' loom://tiny-sparse-mla)."""
    return init_tiny_sparse_mla(tmp_path_factory.mktemp("tiny-sparse-mla") / "tiny")


@pytest.fixture
def write_card(tmp_path: Path) -> CardFactory:
    """write_card(source, version=…, roles=…, …) -> the path of a new card file."""

    def write(source: str, **kw: Any) -> Path:
        path = tmp_path / f"card-{len(list(tmp_path.glob('card-*.yaml')))}.yaml"
        path.write_text(card_text(source, **kw))
        return path

    return write


@pytest.fixture(scope="session")
def child_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment of child processes: one torch thread, a private LOOM_CACHE."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["LOOM_CACHE"] = str(tmp_path_factory.mktemp("loom-cache"))
    return env
