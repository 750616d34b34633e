"""Where the e2e suite runs: the local control plane with the stand-in kubelet (default), with a
real node (kubelet, containerd, CNI, kube-proxy: `E2E_PROVIDER=node`), or kind.

Owns bringing a cluster up and down and the handle tests use (kubeconfig, API client,
kubectl); never holds test logic. `E2E_PROVIDER=kind` picks kind (needs Docker and kind).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from e2e.cluster import control_plane, kwok, node, node_config
from e2e.tools import ensure_tools
from loom_operator.k8s.kube import Kube
from loom_operator.k8s.settings import RenderSettings

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO / ".cache" / "e2e" / "cluster"
# The images `make images` builds, as the renderer (and the chart) name them: the operator image
# (which carries the router), then the CPU runtime.
LOOM_IMAGES = (RenderSettings().router_image, RenderSettings().runtime_image)


@dataclass
class Cluster:
    """A running cluster as tests see it."""

    provider: str
    kubeconfig: Path
    tools: Path  # folder with kubectl and helm
    runs_pods_as_processes: bool  # the stand-in kubelet: pod IPs are reachable from here
    root: Path | None = None  # the local provider's state folder
    _kube: Kube | None = field(default=None, repr=False)

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube(self.kubeconfig)
        return self._kube

    @property
    def env(self) -> dict[str, str]:
        """An environment in which plain `kubectl` and `helm` talk to this cluster."""
        path = f"{self.tools}{os.pathsep}{os.environ.get('PATH', '')}"
        return dict(os.environ, KUBECONFIG=str(self.kubeconfig), PATH=path)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Runs the real kubectl against this cluster; raises with its stderr when asked to."""
        out = subprocess.run(
            [str(self.tools / "kubectl"), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )
        if check and out.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({out.returncode}):\n{out.stderr}"
            )
        return out

    def helm(self, *args: str, check: bool = True, timeout: float = 300.0) -> str:
        """Runs the real helm against this cluster; fails with its output when asked to."""
        out = subprocess.run([str(self.tools / "helm"), *args], capture_output=True, text=True,
                             env=self.env, timeout=timeout)  # fmt: skip
        if check and out.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
        return out.stdout

    def add_fake_nodes(
        self, count: int, capacity: dict[str, str], prefix: str = "kwok-node"
    ) -> list[str]:
        """kwok nodes: scheduled onto, marked Running, run nothing (local provider only)."""
        if self.root is None:
            raise RuntimeError(f"the {self.provider} provider has no kwok nodes")
        state = control_plane.ClusterState.load(self.root)
        assert state is not None
        kwok.start(self.root, Path(state.bin_dir))
        return kwok.add_nodes(self.kube, count, capacity, prefix)


def pod_net(root: Path) -> int:
    """The second octet of this cluster's pod IPs (127.NET.i.x), fixed by its state folder, so
    clusters of different folders (a developer's, the suite's, another clone's) never share
    addresses. 244 is kwok's."""
    digest = hashlib.sha256(str(root.resolve()).encode()).digest()
    return 10 + int.from_bytes(digest[:4], "big") % 230


class Provider(Protocol):
    name: str

    def up(self) -> Cluster: ...

    def down(self) -> None: ...


class LocalProvider:
    """A real control plane built from Go modules, plus the stand-in kubelet (docs/e2e.md)."""

    name = "local"

    def __init__(self, root: Path = DEFAULT_ROOT, nodes: int = 1, backoff_s: float = 10.0) -> None:
        self.root, self.nodes, self.backoff_s = root, nodes, backoff_s

    def up(self) -> Cluster:
        tools = ensure_tools()
        state = control_plane.up(self.root)
        agent_dir = self.root / "node-agent"
        argv = [
            sys.executable, "-m", "e2e.node_agent",
            f"--kubeconfig={state.kubeconfig}", f"--state-dir={agent_dir}",
            f"--nodes={self.nodes}", f"--backoff-seconds={self.backoff_s}",
            f"--pod-net={pod_net(self.root)}",
        ]  # fmt: skip
        # Pods run with the project's environment: its venv's `loom` on PATH, the repo importable.
        env = dict(
            os.environ,
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        )
        control_plane.attach(self.root, "node-agent", argv, env=env)
        cluster = Cluster(self.name, Path(state.kubeconfig), tools, True, self.root)
        wait_usable(cluster, self.nodes)
        return cluster

    def down(self) -> None:
        control_plane.down(self.root)


class NodeProvider:
    """The same control plane, its API server on the node's address, and a real node: the kubelet
    and kube-proxy (loom-node), containerd 2.x with runc, the CNI bridge, Loom's images loaded
    into containerd (`make images` builds them). One per machine (docs/e2e.md)."""

    name = "node"

    def __init__(self, root: Path = DEFAULT_ROOT, images: tuple[str, ...] = LOOM_IMAGES) -> None:
        self.root, self.images = root, images

    def up(self) -> Cluster:
        tools = ensure_tools()
        missing = [i for i in self.images if not _docker_has(i)]
        if missing:
            raise RuntimeError(f"E2E_PROVIDER=node runs Loom's images; build them first "
                               f"(make images): missing {', '.join(missing)}")  # fmt: skip
        node.down(self.root)
        node.prepare_host(self.root)
        try:
            state = control_plane.up(self.root, address=node_config.NODE_IP)
            node.up(self.root, list(self.images))
            cluster = Cluster(self.name, Path(state.kubeconfig), tools, False, self.root)
            wait_usable(cluster, 1)
        except BaseException:
            self.down()
            raise
        return cluster

    def down(self) -> None:
        node.stop_node(self.root)


def _docker_has(image: str) -> bool:
    out = subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False)
    return out.returncode == 0


class KindProvider:
    """kind (Kubernetes in Docker): real kubelets; pods need an image with Loom (images/)."""

    name = "kind"

    def __init__(
        self, root: Path = DEFAULT_ROOT.parent / "kind", cluster: str = "loom-e2e"
    ) -> None:
        self.root, self.cluster = root, cluster

    def up(self) -> Cluster:
        for tool in ("kind", "docker"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"E2E_PROVIDER=kind needs `{tool}` on PATH")
        self.root.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.root / "kubeconfig"
        subprocess.run(
            [
                "kind",
                "create",
                "cluster",
                "--name",
                self.cluster,
                "--kubeconfig",
                str(kubeconfig),
                "--wait",
                "120s",
            ],
            check=True,
        )
        cluster = Cluster(self.name, kubeconfig, ensure_tools(), False)
        wait_usable(cluster, 1)
        return cluster

    def down(self) -> None:
        subprocess.run(["kind", "delete", "cluster", "--name", self.cluster], check=False)


def provider_from_env() -> Provider:
    name = os.environ.get("E2E_PROVIDER", "local")
    if name == "local":
        return LocalProvider(backoff_s=float(os.environ.get("E2E_BACKOFF_SECONDS", "10")))
    if name == "node":
        return NodeProvider()
    if name == "kind":
        return KindProvider()
    raise ValueError(f"E2E_PROVIDER={name!r}: use local, node or kind")


def node_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_usable(cluster: Cluster, nodes: int, timeout: float = 120.0) -> None:
    """Until `nodes` nodes are Ready and namespace default can take pods (its service account
    and root CA ConfigMap exist, made by the controller-manager)."""
    kube = cluster.kube
    deadline = time.monotonic() + timeout
    missing = "nodes"
    while time.monotonic() < deadline:
        ready = [n for n in kube.get("/api/v1/nodes")["items"] if node_ready(n)]
        if len(ready) < nodes:
            missing = f"{nodes - len(ready)} Ready node(s)"
        elif not kube.get("/api/v1/namespaces/default/serviceaccounts")["items"]:
            missing = "the default ServiceAccount"
        elif not kube.get(
            "/api/v1/namespaces/default/configmaps", fieldSelector="metadata.name=kube-root-ca.crt"
        )["items"]:
            missing = "the kube-root-ca.crt ConfigMap"
        else:
            return
        time.sleep(0.25)
    raise TimeoutError(f"cluster not usable after {timeout:.0f} s: waiting for {missing}")
