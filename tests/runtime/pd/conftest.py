"""Fixtures for the P/D tests: a tiny checkpoint, a launcher of real `loom runtime` workers and
P/D proxies (loom_runtime.testing.processes: free ports, readiness polling, always stopped), and
one torch thread in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from loom_runtime.models.tiny import init_tiny
from loom_runtime.testing.processes import Launcher


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("pd-tiny"), seed=0)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Launcher:
    """Workers run float64 (parity) with model name `launcher.model`."""
    return Launcher(tmp_path_factory.mktemp("pd"), tiny_checkpoint)
