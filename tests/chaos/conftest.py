"""Fixtures for the chaos suite: an environment for child processes (one torch thread each, a
private model cache)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def child_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["LOOM_CACHE"] = str(tmp_path_factory.mktemp("chaos-cache"))
    return env
