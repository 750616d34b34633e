"""Fixtures for the P/D tests: the tiny checkpoints (llama and sparse-mla; the latter loaded in
float64), in-process engines joined by real connectors (tests/runtime/pd/engine_workers.py), a
launcher of real `loom runtime` workers and P/D proxies (loom_runtime.testing.processes: free
ports, readiness polling, always stopped), and one torch thread in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.runtime.pd.engine_workers import Workers
from tests.runtime.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

from loom_runtime.models.loader import LoadedModel, load_model
from loom_runtime.models.sparse_mla.tiny import init_tiny_sparse_mla
from loom_runtime.models.tiny import init_tiny
from loom_runtime.testing.processes import Launcher


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("pd-tiny"), seed=0)


@pytest.fixture(scope="session")
def sparse_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_sparse_mla(tmp_path_factory.mktemp("pd-sparse") / "tiny")


@pytest.fixture(scope="module")
def tiny64(tiny_checkpoint: Path) -> LoadedModel:
    return load_model(tiny_checkpoint, dtype=torch.float64)


@pytest.fixture
def tiny_workers(tiny64: LoadedModel) -> Iterator[Workers]:
    """In-process tiny llama engines (float64), every one shut down at the end of the test."""
    w = Workers(tiny64)
    yield w
    w.close()


@pytest.fixture(scope="module")
def sparse64(sparse_checkpoint: Path) -> LoadedModel:
    return load_model(sparse_checkpoint, dtype=torch.float64)


@pytest.fixture
def workers(sparse64: LoadedModel) -> Iterator[Workers]:
    """In-process sparse-mla engines, every one shut down at the end of the test."""
    w = Workers(sparse64)
    yield w
    w.close()


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Launcher:
    """Workers run float64 (parity) with model name `launcher.model`."""
    return Launcher(tmp_path_factory.mktemp("pd"), tiny_checkpoint)
