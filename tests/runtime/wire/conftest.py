"""Fixtures for the wire tests: the tiny checkpoint (a real tokenizer and chat template)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom_runtime.models.tiny import init_tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("tiny") / "tiny")
