"""One torch thread per test where a tiny model runs: its matmuls gain nothing from intra-op
threads, and on a shared 2-core machine two OpenMP threads stall each other (6-7x slower
decode). Imported as an autouse fixture by the conftests (and modules) that need it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
