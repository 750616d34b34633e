"""kwok-managed fake nodes for scale tests: kwok marks their pods Running and runs nothing.

Owns starting kwok for a cluster and creating its nodes; never manages the stand-in
kubelet's nodes (kwok only takes nodes with its annotation).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from e2e.cluster import control_plane
from loom_operator.k8s.kube import STRATEGIC, Kube, KubeError

ANNOTATION = "kwok.x-k8s.io/node"
# Pod IPs kwok hands out. Loopback, like the stand-in kubelet's: a router that watches these
# pods may try to reach them, and nothing here may ever send traffic off this machine.
KWOK_CIDR = "127.244.0.0/16"


def start(root: Path, bin_dir: Path) -> None:
    """Starts kwok against the cluster under `root` (once; a second call is a no-op)."""
    state = control_plane.ClusterState.load(root)
    if state is None:
        raise control_plane.ClusterError(f"no cluster under {root}")
    if any(c.name == "kwok" and c.alive() for c in state.child_handles()):
        return
    stages = sorted((bin_dir.parent / "kwok-stages").glob("*.yaml"))
    argv = [
        str(bin_dir / "kwok"),
        f"--kubeconfig={state.kubeconfig}",
        f"--manage-nodes-with-annotation-selector={ANNOTATION}=fake",
        f"--cidr={KWOK_CIDR}",
        "--node-ip=127.0.0.1",
        "--node-lease-duration-seconds=40",
        f"--server-address=127.0.0.1:{_free_port()}",
    ]
    argv += [f"--config={s}" for s in stages]
    control_plane.attach(root, "kwok", argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def taint_key(capacity: dict[str, str]) -> str:
    """GPU nodes are tainted with their extended resource, as real clusters do (the API
    server's ExtendedResourceToleration plugin lets the pods that request it tolerate it);
    other fake nodes with kwok's own key, so no real pod lands on them by accident."""
    return next((k for k in sorted(capacity) if "/" in k), ANNOTATION)


def node_manifest(name: str, capacity: dict[str, str]) -> dict[str, Any]:
    resources = {"pods": "110", **capacity}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {ANNOTATION: "fake"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        # Tainted so that only pods which ask for these nodes land here (they run nothing).
        "spec": {"taints": [{"key": taint_key(capacity), "value": "fake", "effect": "NoSchedule"}]},
        "status": {"capacity": resources, "allocatable": resources},
    }


def add_nodes(
    kube: Kube, count: int, capacity: dict[str, str], prefix: str = "kwok-node"
) -> list[str]:
    """Creates `count` fake nodes with `capacity` (e.g. {"nvidia.com/gpu": "8"}); returns names."""
    names = []
    for i in range(count):
        name = f"{prefix}-{i}"
        body = node_manifest(name, capacity)
        try:
            kube.create("/api/v1/nodes", body)
        except KubeError as exc:
            if exc.status != 409:
                raise
        kube.patch(f"/api/v1/nodes/{name}/status", {"status": body["status"]}, STRATEGIC)
        names.append(name)
    return names
