"""Fixtures for the local-substrate tests: tiny checkpoints, card files, an environment for
child processes (one torch thread each, a private model cache) and a module's example fleet."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.operator.local.sparse_helpers import example_fleet

from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import FleetProcess
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


@pytest.fixture(scope="module")
def tiny_example(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    checkpoints: tuple[Path, Path],
    child_env: dict[str, str],
) -> Iterator[FleetProcess]:
    """`loom up examples/<EXAMPLE>.yaml` (the module's EXAMPLE) on the tiny checkpoint, once
    per module."""
    name = str(request.module.EXAMPLE)
    root = tmp_path_factory.mktemp(name)
    with example_fleet(name, root, checkpoints[0], child_env, "loom://tiny") as fleet:
        yield fleet
