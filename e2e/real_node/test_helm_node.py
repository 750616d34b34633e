"""`helm install` on the real node: the operator as a real pod of its image under the chart's
ServiceAccount serves `examples/tiny-pd.yaml` (2 decodes, fp64) with its weights on a
PersistentVolumeClaim (a hostPath PersistentVolume holding v1 and v2), through the router's Service
(kube-proxy). Under streaming load, one fleet for the module: a decode container killed on the
node (the kubelet restarts it) and the other decode pod deleted (its StatefulSet recreates it) —
the router migrates their streams —; then the card edited to v2 on the same claim, strategy
Rolling, loaded in place. No request fails and every stream is token-identical to a plain host
worker's greedy run of the version that served it. A source on another claim is refused and
moves nothing; `helm uninstall` leaves nothing of the chart's."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from openai import OpenAI

from e2e.cluster import node
from e2e.conftest import wait_for
from e2e.fleet_helpers import SETTLE_S, condition, invalid, pods, ready, settled
from e2e.providers import REPO, Cluster
from e2e.real_node.claim import CLAIM, claim_manifests, claim_weights, volume_name
from loom_operator.k8s.kube import KubeError
from loom_operator.k8s.render.security import USER
from loom_operator.testing.load import StreamingLoad, check_streams
from loom_operator.testing.weights import Weights
from loom_runtime.card.source import PVC_ROOT
from loom_runtime.wire.pods import WEIGHTS_VERSION_ANNOTATION

pytestmark = pytest.mark.timeout(900)

CHART = REPO / "charts" / "loom"
NAME, MODEL, MAX_TOKENS = "tiny-pd", "tiny", 16
PROMPTS = tuple(f"Node prompt {i}: " + "a story of containers " * (1 + i % 3) for i in range(4))
DECODE = f"loom.dev/deployment={NAME},loom.dev/role=decode"
WORKERS = f"loom.dev/deployment={NAME},app.kubernetes.io/component=worker"


@dataclass(frozen=True)
class Release:
    """The chart installed in `ns`, serving tiny-pd from the claim, and its router's URL."""

    cluster: Cluster
    ns: str
    url: str
    weights: Weights


def chart_objects(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    kinds = "serviceaccounts,roles,rolebindings,deployments,configmaps,pods"
    out = cluster.kubectl("get", kinds, "-n", namespace, "-l", "app.kubernetes.io/part-of=loom",
                          "-o", "json")  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def tiny_pd(decode: int, version: str) -> str:
    """examples/tiny-pd.yaml with `decode` decode workers, no resource requests (this node is the
    real 2-core machine, and the example asks 2 CPUs per worker), fp64 engines (as the host
    references) and its model at pvc://tiny-weights/<version>."""
    docs = list(yaml.safe_load_all((REPO / "examples" / "tiny-pd.yaml").read_text()))
    for doc in docs:
        if doc["kind"] == "ModelCard":
            (component,) = doc["spec"]["components"]
            component["source"] = {"uri": f"pvc://{CLAIM}/{version}"}
            component["weightsVersion"] = version
        if doc["kind"] == "DeploymentCard":
            roles = doc["spec"]["roles"]
            roles["decode"]["replicas"] = decode
            for role in roles.values():
                role.pop("resources", None)
                role["engine"]["dtype"] = "fp64"
    return yaml.safe_dump_all(docs)


@pytest.fixture(scope="module")
def release(node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    cluster, ns = node_cluster, f"helm-{uuid.uuid4().hex[:6]}"
    refs = tmp_path_factory.mktemp("claim-refs")
    with claim_weights(MODEL, PROMPTS, MAX_TOKENS, refs) as weights:
        try:
            cluster.helm("install", "loom", str(CHART), "-n", ns, "--create-namespace",
                 "--set", "operator.kvConnector=tcp", "--wait", "--timeout", "180s")  # fmt: skip
            cluster.kubectl("apply", "-f", "-", input=claim_manifests(weights.paths[0].parent, ns))
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=tiny_pd(decode=2, version="v1"))
            wait_for(lambda: ready(cluster, ns, NAME, decode=2), 600, "tiny-pd Ready, 2 decodes")
            service = cluster.kube.get(f"/api/v1/namespaces/{ns}/services/{NAME}-router")
            url = f"http://{service['spec']['clusterIP']}:8000/v1"  # through kube-proxy
            yield Release(cluster, ns, url, weights)
        finally:
            cluster.helm("uninstall", "loom", "-n", ns, check=False)
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
            cluster.kubectl("delete", "pv", volume_name(ns), "--wait=false", check=False)


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
    """A new pod of that name is ready; between the old one's end and the StatefulSet's next
    there is none (404: not yet)."""
    try:
        pod = cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise
    statuses = pod["status"].get("containerStatuses") or [{}]
    return pod["metadata"]["uid"] != old_uid and bool(statuses[0].get("ready"))


def identities(cluster: Cluster, namespace: str) -> dict[str, tuple[str, int, str]]:
    """Each worker pod's uid, container restarts and weights-version annotation."""
    out = {}
    for pod in pods(cluster, namespace, WORKERS):
        (status,) = pod["status"]["containerStatuses"]
        version = (pod["metadata"].get("annotations") or {}).get(WEIGHTS_VERSION_ANNOTATION, "")
        out[pod["metadata"]["name"]] = (pod["metadata"]["uid"], status["restartCount"], version)
    return out


def test_helm_install_serves_tiny_pd_from_a_claim_through_the_router_service(
    release: Release,
) -> None:
    cluster, ns = release.cluster, release.ns
    (operator,) = [o for o in chart_objects(cluster, ns) if o["kind"] == "Pod"]
    assert operator["spec"]["serviceAccountName"] == "loom-operator"
    chat = OpenAI(base_url=release.url, api_key="unused", timeout=60).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    worker = pods(cluster, ns, DECODE)[0]["metadata"]["name"]
    uid = cluster.kubectl("exec", "-n", ns, worker, "--", "id", "-u").stdout.strip()
    assert uid == str(USER)
    mounted = cluster.kubectl("exec", "-n", ns, worker, "--", "ls", f"{PVC_ROOT}/{CLAIM}")
    assert mounted.stdout.split() == ["v1", "v2"]  # the claim, where every worker mounts it


def test_a_killed_container_and_a_deleted_pod_lose_no_stream(release: Release) -> None:
    cluster, ns = release.cluster, release.ns
    with StreamingLoad(release.url, MODEL, PROMPTS, MAX_TOKENS, clients=2) as load:
        load.wait_completed(4, 120)
        first, second = sorted(p["metadata"]["name"] for p in pods(cluster, ns, DECODE))
        kill_container(cluster, cluster.kube.get(f"/api/v1/namespaces/{ns}/pods/{first}"))
        wait_for(lambda: restarted(cluster, ns, first), 300,
                 f"the kubelet to restart {first}'s container")  # fmt: skip
        wait_for(lambda: ready(cluster, ns, NAME, decode=2), 300, "both decodes back")
        load.wait_completed(4, 120)
        # The other decode pod deleted mid-stream: drained by its grace period, recreated by its
        # StatefulSet (and its claim mounted again).
        old_uid = cluster.kube.get(f"/api/v1/namespaces/{ns}/pods/{second}")["metadata"]["uid"]
        cluster.kubectl("delete", "pod", second, "-n", ns, "--wait=false")
        wait_for(lambda: replaced(cluster, ns, second, old_uid), 300, f"{second} replaced")
        wait_for(lambda: ready(cluster, ns, NAME, decode=2), 300, "both decodes back")
        load.wait_completed(4, 120)
    problems = check_streams(load.stop(), release.weights.expected("v1"))
    assert not problems, "\n".join(problems[:10])


def test_a_rolling_sync_to_the_next_version_on_the_claim_loads_in_place_under_load(
    release: Release,
) -> None:
    cluster, ns = release.cluster, release.ns
    wait_for(lambda: settled(cluster, ns, NAME, "v1"), SETTLE_S, "tiny-pd settled on v1")
    before = identities(cluster, ns)
    with StreamingLoad(release.url, MODEL, PROMPTS, MAX_TOKENS, clients=2) as load:
        load.wait_completed(4, 120)
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=tiny_pd(decode=2, version="v2"))
        wait_for(lambda: settled(cluster, ns, NAME, "v2"), SETTLE_S, "a Rolling sync to v2")
        load.wait_completed(4, 120)
    streams = load.stop()
    problems = check_streams(streams, release.weights.expected("v1", "v2"))
    assert not problems, "\n".join(problems[:10])
    assert {v for s in streams for v in s.versions} == {"v1", "v2"}
    # Every worker on v2, in the same pod and container: loaded in place, not rolled out.
    assert identities(cluster, ns) == {n: (u, r, "v2") for n, (u, r, _) in before.items()}


def test_a_source_on_another_claim_is_refused_and_moves_no_pod(release: Release) -> None:
    cluster, ns = release.cluster, release.ns
    before = identities(cluster, ns)
    other = tiny_pd(decode=2, version="v3").replace(f"pvc://{CLAIM}/", "pvc://other-weights/")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=other)
    card = wait_for(lambda: invalid(cluster, ns, NAME), 60, "the claim change refused")
    valid = condition(card, "Valid")
    assert valid["reason"] == "ClaimChange", valid
    assert "'pvc://other-weights/v3'" in valid["message"], valid["message"]
    assert f"mount claim {CLAIM}" in valid["message"], valid["message"]
    assert identities(cluster, ns) == before


def test_helm_uninstall_leaves_nothing_of_the_charts(release: Release) -> None:
    cluster, ns = release.cluster, release.ns
    cluster.kubectl("delete", "deploymentcard", NAME, "-n", ns, "--wait=true",
                    "--timeout=180s")  # fmt: skip
    cluster.helm("uninstall", "loom", "-n", ns, "--wait", "--timeout", "180s")
    wait_for(lambda: not chart_objects(cluster, ns), 180, "everything the chart made gone")
