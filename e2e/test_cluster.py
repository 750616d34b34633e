"""The e2e cluster itself, on a real API server, controllers and scheduler: CRDs and their
rules, a Loom worker run by the stand-in kubelet, deletion, crash back-off, garbage
collection, and scheduling at scale on kwok nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from e2e.conftest import pod_dir, wait_for
from e2e.providers import REPO, Cluster

# Bounded per case; generous, since a loaded 2-core machine starts a worker in seconds to minutes.
pytestmark = pytest.mark.timeout(600)

MODEL_CARD = (REPO / "examples" / "tiny-aggregated.yaml").read_text().split("\n---\n")[0]


def pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(
        cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout
    )
    return out


def ready(p: dict[str, Any]) -> bool:
    conds = (p.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def ready_pod(
    cluster: Cluster, namespace: str, name: str, not_uid: str = ""
) -> dict[str, Any] | None:
    """The pod once it is Ready (and, given `not_uid`, once it is a new pod of that name)."""
    p = pod(cluster, namespace, name)
    return p if ready(p) and p["metadata"]["uid"] != not_uid else None


def test_api_server_is_ready_and_kubectl_talks_to_it(cluster: Cluster) -> None:
    assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.3")
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert any(n["metadata"]["labels"].get("loom.dev/node-agent") == "true" for n in nodes)


def test_loom_crds_install_and_their_rules_reject_bad_cards(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    for crd in ("deploymentcards.loom.dev", "modelcards.loom.dev", "rolescales.loom.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    docs = list(yaml.safe_load_all((REPO / "examples" / "tiny-aggregated.yaml").read_text()))
    good = yaml.safe_dump_all(docs)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=good)

    cel = docs[1]
    cel["metadata"]["name"] = "cel-breaker"
    cel["spec"]["roles"]["aggregated"]["engine"].update(maxNumSeqs=16, maxNumBatchedTokens=8)
    out = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(cel), check=False
    )
    assert out.returncode != 0
    assert "maxNumBatchedTokens must be at least maxNumSeqs" in out.stderr

    tiers = docs[1]
    tiers["metadata"]["name"] = "tier-breaker"
    role = tiers["spec"]["roles"]["aggregated"]
    role["engine"].update(maxNumSeqs=4, maxNumBatchedTokens=512, prefixCaching=False)
    role["kvOffload"] = {"hostGiB": 1}
    out = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(tiers), check=False
    )
    assert out.returncode != 0
    assert "needs engine.prefixCaching" in out.stderr
    role["engine"]["prefixCaching"] = True
    role["hiSparse"] = {"hostPoolGiB": 1, "offloadGiB": 2}
    out = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(tiers), check=False
    )
    assert out.returncode != 0
    assert "both size the role's one CPU KV offload tier" in out.stderr
    assert "needs engine.prefixCaching" not in out.stderr
    del role["hiSparse"]  # one tier, with prefix caching: accepted
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(tiers))

    board = list(yaml.safe_load_all((REPO / "examples" / "tiny-storyboard.yaml").read_text()))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(board[1]))
    flow = board[1]
    flow["metadata"]["name"] = "workflow-breaker"
    stages = flow["spec"]["workflows"][0]["stages"]
    stages[1]["deploymentCard"] = "tiny-mot"
    out = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(flow), check=False
    )
    assert out.returncode != 0
    assert "the last stage runs on this card" in out.stderr
    del stages[1]["deploymentCard"]
    stages[0]["route"] = "videos"
    out = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(flow), check=False
    )
    assert out.returncode != 0
    assert "every stage before the last is an images stage" in out.stderr

    schema = docs[1]
    schema["metadata"]["name"] = "schema-breaker"
    schema["spec"]["roles"]["aggregated"]["replicas"] = "many"
    out = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(schema), check=False
    )
    assert out.returncode != 0
    assert "replicas" in out.stderr


POD_IP = {"fieldRef": {"fieldPath": "status.podIP"}}


def probe(path: str, **timing: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, **timing}


def running(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def worker_manifests(namespace: str) -> str:
    """A StatefulSet running one aggregated Loom worker, its card from a ConfigMap."""
    command = [
        "loom", "runtime", "--card", "/etc/loom/card.yaml", "--role", "aggregated",
        "--host", "$(POD_IP)", "--port", "8000", "--max-num-seqs", "4", "--max-model-len", "512",
    ]  # fmt: skip
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "tiny-card", "namespace": namespace},
            "data": {"card.yaml": MODEL_CARD},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "tiny", "namespace": namespace},
            "spec": {
                "serviceName": "tiny",
                "replicas": 1,
                "selector": {"matchLabels": {"app": "tiny"}},
                "template": {
                    "metadata": {"labels": {"app": "tiny"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 30,
                        "containers": [
                            {
                                "name": "runtime",
                                "image": "loom-runtime:dev",
                                "command": command,
                                "env": [
                                    {"name": "POD_IP", "valueFrom": POD_IP},
                                    {"name": "PYTHONUNBUFFERED", "value": "1"},
                                ],
                                "ports": [{"name": "http", "containerPort": 8000}],
                                "readinessProbe": probe("/ready", periodSeconds=1),
                                "livenessProbe": probe("/health", periodSeconds=5),
                                "volumeMounts": [
                                    {"name": "card", "mountPath": "/etc/loom", "readOnly": True}
                                ],
                            }
                        ],
                        "volumes": [{"name": "card", "configMap": {"name": "tiny-card"}}],
                    },
                },
            },
        },
    ]  # fmt: skip
    return yaml.safe_dump_all(docs)


def test_a_loom_worker_runs_on_the_stand_in_kubelet_and_survives_pod_deletion(
    cluster: Cluster, namespace: str
) -> None:
    if not cluster.runs_pods_as_processes:
        pytest.skip("needs pod IPs reachable from the test (the local provider); kind runs images")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=worker_manifests(namespace))
    first = wait_for(lambda: ready_pod(cluster, namespace, "tiny-0"), 300, "tiny-0 Ready")
    node = first["spec"]["nodeName"]
    assert (
        json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)["metadata"]["labels"][
            "loom.dev/node-agent"
        ]
        == "true"
    )
    ip = first["status"]["podIP"]
    assert ip.startswith("127.") and ip != "127.0.0.1"

    client = OpenAI(base_url=f"http://{ip}:8000/v1", api_key="unused", timeout=60)
    out = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=4)
    assert out.usage is not None and out.usage.completion_tokens == 4
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].finish_reason in ("length", "stop")

    # Deletion: SIGTERM, the worker drains and exits, and the StatefulSet brings tiny-0 back.
    pid = int(first["status"]["containerStatuses"][0]["containerID"].removeprefix("loom-e2e://"))
    log = pod_dir(cluster, namespace, "tiny-0", first["metadata"]["uid"]) / "runtime.log"
    cluster.kubectl("delete", "pod", "tiny-0", "-n", namespace, "--wait=false")
    uid = first["metadata"]["uid"]
    second = wait_for(lambda: ready_pod(cluster, namespace, "tiny-0", uid), 300, "a new tiny-0")
    assert not running(pid), "the old worker process is still running"
    text = log.read_text()
    assert "stopping" in text, f"the worker did not shut down on SIGTERM:\n{text[-2000:]}"
    again = OpenAI(
        base_url=f"http://{second['status']['podIP']}:8000/v1", api_key="unused", timeout=60
    )
    assert again.completions.create(model="tiny", prompt="again", max_tokens=2).usage is not None

    # Garbage collection: deleting the StatefulSet takes its pod with it (real GC controller).
    cluster.kubectl("delete", "statefulset", "tiny", "-n", namespace, "--cascade=background")
    wait_for(
        lambda: (
            not json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)[
                "items"
            ]
        ),
        120,
        "the StatefulSet's pods to be garbage-collected",
    )


def test_a_crashing_container_backs_off_in_crash_loop(cluster: Cluster, namespace: str) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "crasher", "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "c", "image": "busybox", "command": ["sh", "-c", "echo boom; exit 3"]}
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))

    def looping() -> dict[str, Any] | None:
        status = pod(cluster, namespace, "crasher").get("status") or {}
        cs = (status.get("containerStatuses") or [{}])[0]
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if cs.get("restartCount", 0) >= 2 and waiting.get("reason") == "CrashLoopBackOff":
            return dict(cs)
        return None

    cs = wait_for(looping, 120, "CrashLoopBackOff after two restarts")
    assert cs["lastState"]["terminated"]["exitCode"] == 3
    events = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "reason=BackOff", "-o", "name"
    )
    assert events.stdout.strip(), "no BackOff event was recorded"


def test_deleting_an_owner_garbage_collects_its_children(cluster: Cluster, namespace: str) -> None:
    kube, path = cluster.kube, f"/api/v1/namespaces/{namespace}/configmaps"
    owner = kube.create(path, {"metadata": {"name": "owner"}, "data": {}})
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    for i in range(3):
        kube.create(path, {"metadata": {"name": f"child-{i}", "ownerReferences": [ref]}})
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)

    def children() -> list[str]:
        names = [c["metadata"]["name"] for c in kube.get(path)["items"]]
        return [n for n in names if n.startswith("child-")]

    wait_for(lambda: not children(), 60, "the children to be garbage-collected")


GPU_NODES, GPUS_PER_NODE = 100, 10


def test_kwok_nodes_take_a_thousand_gpu_pods_within_capacity(
    cluster: Cluster, namespace: str
) -> None:
    """The real scheduler packs 1,000 one-GPU pods onto 100 × 10 GPUs; the 1,001st waits."""
    if cluster.root is None:
        pytest.skip("kwok nodes are the local provider's")
    capacity = {"nvidia.com/gpu": str(GPUS_PER_NODE), "cpu": "64", "memory": "2Ti"}
    names = cluster.add_fake_nodes(GPU_NODES, capacity)
    kube, replicas = cluster.kube, GPU_NODES * GPUS_PER_NODE
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    try:
        kube.create(deployments, gpu_deployment(replicas + 1))

        def placed() -> dict[str, int] | None:
            per_node: dict[str, int] = {}
            pending = []
            for p in kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
                node = p["spec"].get("nodeName")
                if node:
                    per_node[node] = per_node.get(node, 0) + 1
                else:
                    pending.append(p)
            # The scheduler binds the last pod it can fit before it marks the one it cannot,
            # so wait for the mark too rather than reading the Pending pod's first listing.
            done = (
                sum(per_node.values()) == replicas
                and len(pending) == 1
                and unschedulable(pending[0])
            )
            return per_node if done else None

        per_node = wait_for(
            placed, 300, f"{replicas} pods bound, one Pending and Unschedulable", interval=2.0
        )
        assert set(per_node) <= set(names), "a GPU pod landed on a node without GPUs"
        assert max(per_node.values()) <= GPUS_PER_NODE
    finally:
        kube.delete(f"{deployments}/gpus", {"propagationPolicy": "Background"})
        for name in names:
            kube.delete(f"/api/v1/nodes/{name}")


def unschedulable(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("reason") == "Unschedulable" for c in conditions)


def gpu_deployment(replicas: int) -> dict[str, Any]:
    container = {
        "name": "gpu",
        "image": "loom-runtime:dev",
        "command": ["sleep", "infinity"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpus"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "gpus"}},
            "template": {
                "metadata": {"labels": {"app": "gpus"}},
                # No toleration: ExtendedResourceToleration adds the one for nvidia.com/gpu.
                "spec": {"containers": [container]},
            },
        },
    }


def test_down_leaves_no_process_behind(cluster: Cluster) -> None:
    """The stop path, on a cluster of its own (the session's stays up for the other tests)."""
    if cluster.root is None:
        pytest.skip("the local provider's processes")
    from e2e.cluster import control_plane
    from e2e.providers import LocalProvider

    root = cluster.root.parent / "down-check"
    provider = LocalProvider(root)
    provider.up()
    state = control_plane.ClusterState.load(root)
    assert state is not None
    pids = [c.pid for c in state.child_handles()]
    provider.down()
    alive = [p for p in pids if running(p)]
    assert not alive, f"still running after down: {alive}"
