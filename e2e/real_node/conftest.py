"""Fixtures of the real-node suite: one cluster with a real kubelet, containerd, kube-proxy and
NetworkPolicy enforcement running Loom's images (E2E_PROVIDER=node's provider), up for this
package's tests only, and a namespace per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from e2e.conftest import wait_for
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


@pytest.fixture
def namespace(node_cluster: Cluster) -> Iterator[str]:
    """A fresh namespace, once its default ServiceAccount exists (pods need it); deleted after."""
    name = f"node-{uuid.uuid4().hex[:6]}"
    node_cluster.kubectl("create", "namespace", name)
    account = ("get", "serviceaccount", "default", "-n", name)
    wait_for(lambda: node_cluster.kubectl(*account, check=False).returncode == 0, 60,
             "the namespace's ServiceAccount")  # fmt: skip
    try:
        yield name
    finally:
        node_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
