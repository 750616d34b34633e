"""Fixtures of the real-node suite: one cluster with a real kubelet, containerd and kube-proxy
running Loom's images (E2E_PROVIDER=node's provider), up for this package's tests only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.providers import REPO, Cluster, NodeProvider


@pytest.fixture(scope="package")
def node_cluster() -> Iterator[Cluster]:
    # Its own state folder, so a developer's `make e2e-cluster` is left alone.
    provider = NodeProvider(REPO / ".cache" / "e2e" / "pytest-node")
    handle = provider.up()
    try:
        yield handle
    finally:
        provider.down()
