"""The cluster side of bench/operator_scale.py: the e2e harness's real control plane with kwok
nodes (GPU nodes for the workers, untainted ones for the routers) and Loom's CRDs, namespaces,
and deleting cards and namespaces within a bound.

Owns waiting and what the bench prints as it goes; never starts the operator or times it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.cluster import control_plane, kwok
from e2e.providers import Cluster, node_ready
from e2e.tools import ensure_tools

from loom_operator.k8s.kube import Kube, object_path

ROOT = Path(__file__).resolve().parent.parent
GPU_NODES, ROUTER_NODES = 100, 3
GPU_NODE = {"nvidia.com/gpu": "8", "cpu": "128", "memory": "2Ti"}
ROUTER_NODE = {"cpu": "64", "memory": "256Gi"}
START = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - START:7.1f}s] {text}", flush=True)


def wait(probe: Callable[[], Any], timeout: float, what: str, interval: float = 1.0) -> Any:
    """Polls `probe` until it returns something truthy other than a string (a string says what
    is still missing, and goes into the error when `timeout` passes)."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = probe()
        if last and not isinstance(last, str):
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} ({last})")


def start_cluster(root: Path, gpu_nodes: int = GPU_NODES, router_pods: int = 110) -> Cluster:
    """The control plane under `root`, its kwok nodes Ready (`gpu_nodes` of 8 GPUs, and room for
    `router_pods` on the router nodes) and the CRDs Established."""
    say(f"starting the control plane under {root.relative_to(ROOT)}")
    state = control_plane.up(root)
    cluster = Cluster("local", Path(state.kubeconfig), ensure_tools(), False, root)
    say(f"registering {gpu_nodes} kwok nodes of 8 GPUs and {ROUTER_NODES} for the routers")
    nodes = cluster.add_fake_nodes(gpu_nodes, GPU_NODE)
    router_node = ROUTER_NODE | {"pods": str(max(110, -(-router_pods // ROUTER_NODES)))}
    for name in kwok.add_nodes(cluster.kube, ROUTER_NODES, router_node, prefix="kwok-router"):
        cluster.kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})
        nodes.append(name)

    def ready() -> bool | str:
        items = cluster.kube.get("/api/v1/nodes")["items"]
        up = sum(1 for n in items if n["metadata"]["name"] in nodes and node_ready(n))
        return up == len(nodes) or f"{up}/{len(nodes)} Ready"

    wait(ready, 180, f"the kwok nodes to be Ready (see {root / 'logs' / 'kwok.log'})")
    say("installing the CRDs")
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    for crd in ("deploymentcards.loom.dev", "modelcards.loom.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    return cluster


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def make_namespace(kube: Kube, namespace: str) -> None:
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": namespace}})  # fmt: skip
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts"
    wait(lambda: kube.get(path)["items"], 60, f"the default ServiceAccount of {namespace}", 0.25)


def delete_cards(kube: Kube, namespace: str, timeout: float) -> float | None:
    """Deletes the DeploymentCards while the operator runs (its daemons hold a finalizer): the
    seconds until they are gone, or None if it never let go (their finalizers are then cut)."""
    say(f"deleting the DeploymentCards of {namespace}")
    path, t0 = object_path("DeploymentCard", namespace), time.monotonic()
    kube.delete(path)
    try:
        wait(lambda: not kube.get(path)["items"], timeout, "the operator to release the cards")
        return time.monotonic() - t0
    except TimeoutError as exc:
        say(f"{exc}; removing their finalizers")
        for card in kube.get(path)["items"]:
            name = object_path("DeploymentCard", namespace, card["metadata"]["name"])
            kube.patch(name, {"metadata": {"finalizers": None}})
        return None


def drop_namespace(kube: Kube, namespace: str, timeout: float) -> None:
    say(f"deleting namespace {namespace}")
    kube.delete(f"/api/v1/namespaces/{namespace}")

    def gone() -> bool | str:
        names = [n["metadata"]["name"] for n in kube.get("/api/v1/namespaces")["items"]]
        pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        if pods:  # kwok waits out each pod's grace period (a worker's: its drain timeout)
            kube.delete(f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0})
        return namespace not in names or f"{len(pods)} pods left"

    wait(gone, timeout, f"namespace {namespace} to be deleted", 2.0)
