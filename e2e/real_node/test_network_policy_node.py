"""NetworkPolicies enforced on the real node (kube-network-policies: nftables + NFQUEUE): with the
NetworkPolicies the operator renders for examples/tiny-pd.yaml, a pod they do not name can open
none of a worker's ports, a pod labelled as the deployment's router opens the OpenAI and KV-event
ports and not the KV side port or the control port, a peer worker opens the KV side port, and a
pod labelled as the deployment's trainer (a push's gloo group) opens every port."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest
import yaml

from e2e.conftest import wait_for
from e2e.providers import LOOM_IMAGES, REPO, Cluster
from loom_operator.api.documents import load_documents
from loom_operator.k8s.render.network import network_policies
from loom_operator.k8s.render.security import container_security, pod_security
from loom_operator.k8s.settings import RenderSettings
from loom_runtime.wire.pods import (
    COMPONENT_LABEL,
    CONTROL_PORT,
    DEPLOYMENT_LABEL,
    HTTP_PORT,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    KV_SIDE_PORT,
    TRAINER_LABEL,
    WORKER_PORTS,
)

pytestmark = pytest.mark.timeout(300)

RUNTIME_IMAGE = LOOM_IMAGES[1]  # python is in it
(DEPLOYMENT,) = load_documents(REPO / "examples" / "tiny-pd.yaml").deployment_cards
WORKER = {DEPLOYMENT_LABEL: DEPLOYMENT.name, COMPONENT_LABEL: "worker"}
ROUTER = {DEPLOYMENT_LABEL: DEPLOYMENT.name, COMPONENT_LABEL: "router"}
PORTS = sorted(WORKER_PORTS.values())
# A worker stand-in: listens on every port a worker declares (the kernel accepts connections
# into the backlog; nothing needs to answer), so a refused connection never looks like a block.
LISTEN = f"import socket, time\nkeep = [socket.create_server(('', p)) for p in {PORTS}]\n" \
         "time.sleep(3600)"  # fmt: skip
# Connects to each port at once, 2 s each; prints {port: "open" | "timeout" | the error}.
PROBE = """import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def reach(port):
    try:
        socket.create_connection((sys.argv[1], port), timeout=2).close()
        return "open"
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return type(e).__name__
ports = [int(p) for p in sys.argv[2:]]
print(json.dumps(dict(zip(ports, ThreadPoolExecutor(len(ports)).map(reach, ports)))))
"""


def pod(name: str, labels: dict[str, str], command: list[str], ports: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main", "image": RUNTIME_IMAGE, "imagePullPolicy": "Never", "command": command,
        "securityContext": container_security(),
    }  # fmt: skip
    if ports:  # named as a worker's, which the policies' rules name
        container["ports"] = [{"name": n, "containerPort": p} for n, p in WORKER_PORTS.items()]
        container["readinessProbe"] = {"tcpSocket": {"port": KV_SIDE_PORT}, "periodSeconds": 1}
    spec = {"securityContext": pod_security(), "containers": [container],
            "terminationGracePeriodSeconds": 0}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": spec}  # fmt: skip


def ready_ip(cluster: Cluster, namespace: str, name: str) -> str | None:
    status = cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")["status"]
    conditions = status.get("conditions") or []
    ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return status.get("podIP") if ok else None


def reach(cluster: Cluster, namespace: str, client: str, ip: str, *names: str) -> dict[str, str]:
    """What `client` gets connecting to each named worker port of `ip`, from inside its pod."""
    ports = [str(WORKER_PORTS[n]) for n in names]
    out = cluster.kubectl("exec", "-n", namespace, client, "--", "python", "-c", PROBE, ip, *ports)
    by_number = json.loads(out.stdout)
    return {n: by_number[str(WORKER_PORTS[n])] for n in names}


def test_worker_policy_keeps_strangers_off_kv_ports_and_admits_the_router_and_peers(
    node_cluster: Cluster, namespace: str
) -> None:
    cluster, ns = node_cluster, namespace
    sleep = ["python", "-c", "import time; time.sleep(3600)"]
    pods = [pod("worker", WORKER, ["python", "-c", LISTEN], ports=True),
            pod("stranger", {"app": "stranger"}, sleep, ports=False),
            pod("router", ROUTER, sleep, ports=False),
            pod("peer", WORKER, sleep, ports=False),
            pod("trainer", {TRAINER_LABEL: DEPLOYMENT.name}, sleep, ports=False)]  # fmt: skip
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(pods))
    for name in ("stranger", "router", "peer", "trainer"):
        wait_for(partial(ready_ip, cluster, ns, name), 120, f"pod {name} Ready")
    worker = wait_for(lambda: ready_ip(cluster, ns, "worker"), 120, "the worker stand-in Ready")

    def kv_side(client: str) -> str:
        return reach(cluster, ns, client, worker, KV_SIDE_PORT)[KV_SIDE_PORT]

    every = (HTTP_PORT, CONTROL_PORT, KV_EVENTS_PORT, KV_REPLAY_PORT, KV_SIDE_PORT)
    # Without a policy the pod network lets anyone in: a block below is the policy's doing.
    assert reach(cluster, ns, "stranger", worker, *every) == dict.fromkeys(every, "open")

    settings = RenderSettings(network_policies=True, operator_namespace=ns)
    policies = network_policies(DEPLOYMENT, settings)
    assert {p["metadata"]["name"] for p in policies} == {"tiny-pd-workers", "tiny-pd-router"}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(policies))
    wait_for(lambda: kv_side("stranger") == "timeout", 60, "the workers' NetworkPolicy enforced")

    assert reach(cluster, ns, "stranger", worker, *every) == dict.fromkeys(every, "timeout")
    assert reach(cluster, ns, "router", worker, *every) == {
        HTTP_PORT: "open", KV_EVENTS_PORT: "open", KV_REPLAY_PORT: "open",
        KV_SIDE_PORT: "timeout", CONTROL_PORT: "timeout",  # the workers', and the operator's
    }  # fmt: skip
    assert reach(cluster, ns, "peer", worker, *every) == dict.fromkeys(every, "open")
    assert reach(cluster, ns, "trainer", worker, *every) == dict.fromkeys(every, "open")

    cluster.kubectl("delete", "networkpolicy", "-n", ns, "--all")
    wait_for(lambda: kv_side("stranger") == "open", 60, "the stranger let in once policies go")
