"""Fixtures of the e2e suite: one cluster per session (E2E_PROVIDER picks it), a namespace
per test, and polling helpers that wait on conditions (never on fixed sleeps)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from e2e.fleet_helpers import MAX_TOKENS, MODEL, PROMPTS
from e2e.providers import REPO, Cluster, LocalProvider, provider_from_env
from loom_operator.testing.weights import Weights, two_versions
from loom_runtime.models.tiny import init_tiny

T = TypeVar("T")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    provider = provider_from_env()
    if isinstance(provider, LocalProvider):
        # Its own state folder, so a developer's `make e2e-cluster` is left alone.
        provider.root = REPO / ".cache" / "e2e" / "pytest-cluster"
    handle = provider.up()
    try:
        yield handle
    finally:
        provider.down()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        60,
        f"the default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def weights(tmp_path_factory: pytest.TempPathFactory, cluster: Cluster) -> Weights:
    """Two tiny checkpoints that answer differently, and each one's greedy references."""
    root = tmp_path_factory.mktemp("sync-weights")
    paths = (init_tiny(root / "a", seed=0), init_tiny(root / "b", seed=1))
    return two_versions(paths, MODEL, PROMPTS, MAX_TOKENS, root, cluster.env)


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Polls `probe` until it returns something truthy; fails the test naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            last = probe()
        except AssertionError:
            last = None
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def pod_dir(cluster: Cluster, namespace: str, name: str, uid: str) -> Path:
    """Where the stand-in kubelet keeps one pod's files and container logs."""
    assert cluster.root is not None
    return cluster.root / "node-agent" / "pods" / f"{namespace}_{name}_{uid[:8]}"
