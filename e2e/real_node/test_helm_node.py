"""`helm install` on the real node: the operator as a real pod of its image under the chart's
ServiceAccount, `kubectl apply -f examples/tiny-pd.yaml`, the openai client through the router's
Service (kube-proxy), under streaming load a decode container killed on the node (the kubelet
restarts it) and the other decode pod deleted (its StatefulSet recreates it) — the router
migrates their streams: every stream token-identical, none failed — and `helm uninstall`
leaving nothing of the chart's."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from e2e.cluster import node
from e2e.conftest import wait_for
from e2e.fleet_helpers import pods, ready
from e2e.providers import REPO, Cluster
from loom_operator.k8s.render.security import USER
from loom_operator.testing.load import StreamingLoad, check_streams, reference_streams

pytestmark = pytest.mark.timeout(900)

CHART = REPO / "charts" / "loom"
NAME, MODEL, MAX_TOKENS = "tiny-pd", "tiny", 16
PROMPTS = tuple(f"Node prompt {i}: " + "a story of containers " * (1 + i % 3) for i in range(4))
DECODE = f"loom.dev/deployment={NAME},loom.dev/role=decode"


def chart_objects(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    kinds = "serviceaccounts,roles,rolebindings,deployments,configmaps,pods"
    out = cluster.kubectl("get", kinds, "-n", namespace, "-l", "app.kubernetes.io/part-of=loom",
                          "-o", "json")  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def tiny_pd(decode: int) -> str:
    """examples/tiny-pd.yaml with `decode` decode workers and no resource requests: this node is
    the real 2-core machine, and the example asks 2 CPUs per worker."""
    docs = list(yaml.safe_load_all((REPO / "examples" / "tiny-pd.yaml").read_text()))
    for doc in docs:
        if doc["kind"] == "DeploymentCard":
            roles = doc["spec"]["roles"]
            roles["decode"]["replicas"] = decode
            for role in roles.values():
                role.pop("resources", None)
    return yaml.safe_dump_all(docs)


def kill_container(cluster: Cluster, pod: dict[str, Any]) -> None:
    """SIGKILLs the pod's container on the node, through containerd: a fault below Kubernetes."""
    (status,) = pod["status"]["containerStatuses"]
    container = status["containerID"].removeprefix("containerd://")
    assert cluster.root is not None
    layout = node.layout_of(cluster.root)
    subprocess.run([str(layout.bin_dir / "ctr"), "--address", str(layout.containerd_socket),
                    "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", container],
                   check=True, capture_output=True)  # fmt: skip


def restarted(cluster: Cluster, namespace: str, name: str) -> bool:
    pod = cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    (status,) = pod["status"].get("containerStatuses") or [{}]
    return bool(status.get("restartCount", 0) >= 1 and status.get("ready"))


def replaced(cluster: Cluster, namespace: str, name: str, old_uid: str) -> bool:
    pod = cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    statuses = pod["status"].get("containerStatuses") or [{}]
    return pod["metadata"]["uid"] != old_uid and bool(statuses[0].get("ready"))


def test_helm_install_serves_tiny_pd_through_the_router_service_on_real_containers(
    node_cluster: Cluster, tmp_path: Path
) -> None:
    cluster, ns = node_cluster, f"helm-{uuid.uuid4().hex[:6]}"
    try:
        cluster.helm("install", "loom", str(CHART), "-n", ns, "--create-namespace",
             "--set", "operator.kvConnector=tcp", "--wait", "--timeout", "180s")  # fmt: skip
        (operator,) = [o for o in chart_objects(cluster, ns) if o["kind"] == "Pod"]
        assert operator["spec"]["serviceAccountName"] == "loom-operator"

        cluster.kubectl("apply", "-n", ns, "-f", "-", input=tiny_pd(decode=2))
        wait_for(lambda: ready(cluster, ns, NAME, decode=2), 600, "tiny-pd Ready with 2 decodes")
        service = cluster.kube.get(f"/api/v1/namespaces/{ns}/services/{NAME}-router")
        url = f"http://{service['spec']['clusterIP']}:8000/v1"  # through kube-proxy
        chat = OpenAI(base_url=url, api_key="unused", timeout=60).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert chat.usage is not None and chat.usage.completion_tokens == 4

        worker = pods(cluster, ns, DECODE)[0]["metadata"]["name"]
        uid = cluster.kubectl("exec", "-n", ns, worker, "--", "id", "-u").stdout.strip()
        assert uid == str(USER)

        refs = reference_streams(url, MODEL, PROMPTS, MAX_TOKENS)
        with StreamingLoad(url, MODEL, PROMPTS, MAX_TOKENS, clients=2) as load:
            load.wait_completed(4, 120)
            first, second = sorted(p["metadata"]["name"] for p in pods(cluster, ns, DECODE))
            kill_container(cluster, cluster.kube.get(f"/api/v1/namespaces/{ns}/pods/{first}"))
            wait_for(lambda: restarted(cluster, ns, first), 300,
                     f"the kubelet to restart {first}'s container")  # fmt: skip
            wait_for(lambda: ready(cluster, ns, NAME, decode=2), 300, "both decodes back")
            load.wait_completed(4, 120)
            # The other decode pod deleted mid-stream: drained by its grace period, recreated by
            # its StatefulSet.
            old_uid = cluster.kube.get(f"/api/v1/namespaces/{ns}/pods/{second}")["metadata"]["uid"]
            cluster.kubectl("delete", "pod", second, "-n", ns, "--wait=false")
            wait_for(lambda: replaced(cluster, ns, second, old_uid), 300, f"{second} replaced")
            wait_for(lambda: ready(cluster, ns, NAME, decode=2), 300, "both decodes back")
            load.wait_completed(4, 120)
        problems = check_streams(load.stop(), {"v1": refs})
        assert not problems, "\n".join(problems[:10])

        cluster.kubectl("delete", "deploymentcard", NAME, "-n", ns, "--wait=true",
                        "--timeout=180s")  # fmt: skip
        cluster.helm("uninstall", "loom", "-n", ns, "--wait", "--timeout", "180s")
        wait_for(lambda: not chart_objects(cluster, ns), 180, "everything the chart made gone")
    finally:
        cluster.helm("uninstall", "loom", "-n", ns, check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
