"""A real node: the kubelet and containerd register it Ready, a pod of Loom's runtime image
serves a completion through a ClusterIP Service (kube-proxy), reached by name through the cluster
DNS (CoreDNS) too, as a non-root user on a read-only root filesystem with no capabilities, and
`kubectl logs` / `exec` reach it."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import yaml

from e2e.cluster.node_config import NODE_IP
from e2e.conftest import wait_for
from e2e.providers import LOOM_IMAGES, REPO, Cluster
from loom_operator.k8s.render.security import (
    SCRATCH_ENV,
    SCRATCH_MOUNT,
    SCRATCH_VOLUME,
    USER,
    container_security,
    pod_security,
)

pytestmark = pytest.mark.timeout(600)

RUNTIME_IMAGE = LOOM_IMAGES[1]
MODEL_CARD = next(d for d in yaml.safe_load_all((REPO / "examples" / "tiny-pd.yaml").read_text())
                  if d["kind"] == "ModelCard")  # fmt: skip


def test_the_node_is_ready_with_its_real_kubelet_and_container_runtime(
    node_cluster: Cluster,
) -> None:
    (node,) = node_cluster.kube.get("/api/v1/nodes")["items"]
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.36.3"
    assert info["containerRuntimeVersion"].startswith("containerd://2.")
    wide = node_cluster.kubectl("get", "nodes", "-o", "wide").stdout
    assert " Ready " in wide and "containerd://2." in wide, wide


def runtime_pod(name: str) -> list[dict[str, Any]]:
    """A ConfigMap with the tiny ModelCard, a pod of the runtime image serving it, a Service."""
    labels = {"app": name}
    command = ["loom", "runtime", "--card", "/etc/loom/card.yaml", "--role", "aggregated",
               "--host", "0.0.0.0", "--port", "8000"]  # fmt: skip
    container = {
        "name": "runtime", "image": RUNTIME_IMAGE, "imagePullPolicy": "Never", "command": command,
        "env": [SCRATCH_ENV], "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "card", "mountPath": "/etc/loom", "readOnly": True},
                         SCRATCH_MOUNT],
        "securityContext": container_security(),
    }  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
         "data": {"card.yaml": yaml.safe_dump(MODEL_CARD)}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
         "spec": {"securityContext": pod_security(), "containers": [container],
                  "volumes": [{"name": "card", "configMap": {"name": name}}, SCRATCH_VOLUME]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
         "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": "http"}]}},
    ]  # fmt: skip


def completion(base: str) -> dict[str, Any]:
    """Eight sampled tokens (ignore_eos: a sampled end-of-text must not cut them short)."""
    doc = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True}
    body = json.dumps(doc).encode()
    req = urllib.request.Request(f"{base}/v1/completions", body,
                                 {"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            out: dict[str, Any] = json.loads(r.read())
    except urllib.error.HTTPError as e:  # say who answered what
        raise AssertionError(f"{base}: HTTP {e.code} {e.read()[:500]!r} {dict(e.headers)}") from e
    return out


def through_service(base: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """A completion through a Service just made: kube-proxy writes its rules after the pod is
    Ready, not with it, so until then an attempt may fail; every failure is kept and shown."""
    failures: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return completion(base)
        except (AssertionError, urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            failures.append(str(exc))
            if time.monotonic() > deadline:
                raise AssertionError(f"{base} never answered: {failures}") from exc
            time.sleep(1.0)


def lookup_in_pod(cluster: Cluster, namespace: str, pod: str, name: str) -> dict[str, Any]:
    """From inside `pod`: what `name` and its SERVICE.NAMESPACE form (through the search list)
    resolve to, /ready by name over HTTP, the pod's nameservers, and what a name outside the
    cluster gives. (The bare pod name is in the pod's /etc/hosts, so it proves nothing.)"""
    script = (
        "import json, socket, sys, urllib.request\n"
        "name = sys.argv[1]\n"
        "with urllib.request.urlopen(f'http://{name}/ready', timeout=30) as r:\n"
        "    status = r.status\n"
        "try:\n"
        "    other = socket.gethostbyname('nothing.invalid')\n"
        "except socket.gaierror as e:\n"
        "    other = e.errno\n"
        "servers = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')]\n"
        "short = name.split('.svc.')[0]\n"
        "print(json.dumps({'ip': socket.gethostbyname(name), 'short': socket.gethostbyname(short),"
        " 'status': status, 'other': other, 'nameservers': servers}))\n"
    )
    out = cluster.kubectl("exec", "-n", namespace, pod, "--", "python", "-c", script, name)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_runtime_image_pod_serves_a_completion_through_a_service_by_ip_and_by_dns_name(
    node_cluster: Cluster, namespace: str
) -> None:
    docs = runtime_pod("tiny")
    node_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))

    def ready() -> dict[str, Any] | None:
        pod = node_cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods/tiny")
        conditions = pod["status"].get("conditions") or []
        ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        return pod if ok else None

    pod = wait_for(ready, 300, "the runtime pod Ready (it generates the tiny checkpoint)")
    service = node_cluster.kube.get(f"/api/v1/namespaces/{namespace}/services/tiny")
    out = through_service(f"http://{service['spec']['clusterIP']}:80")  # kube-proxy
    assert out["usage"]["completion_tokens"] == 8
    assert out["choices"][0]["text"]
    slices = node_cluster.kube.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        labelSelector="kubernetes.io/service-name=tiny",
    )
    (endpoint,) = [e for s in slices["items"] for e in s.get("endpoints") or []]
    assert endpoint["addresses"] == [pod["status"]["podIP"]]
    # The cluster DNS (CoreDNS on the node's address) names the Service; nothing else resolves.
    found = lookup_in_pod(node_cluster, namespace, "tiny", f"tiny.{namespace}.svc.cluster.local")
    assert found["nameservers"] == [NODE_IP]
    assert found["ip"] == found["short"] == service["spec"]["clusterIP"]
    assert found["status"] == 200  # an HTTP GET by name reached the pod through the Service
    assert found["other"] == socket.EAI_NONAME  # NXDOMAIN, answered at once

    exec_id = node_cluster.kubectl("exec", "-n", namespace, "tiny", "--", "id", "-u").stdout
    assert exec_id.strip() == str(USER)
    # The uid has a name (kopf and getpass look it up) and a home on the scratch volume.
    whoami = node_cluster.kubectl("exec", "-n", namespace, "tiny", "--", "whoami").stdout
    assert whoami.strip() == "loom"
    touch = node_cluster.kubectl("exec", "-n", namespace, "tiny", "--", "touch", "/opt/loom/x",
                                 check=False)  # fmt: skip
    assert touch.returncode != 0 and "Read-only file system" in touch.stderr
    caps = node_cluster.kubectl("exec", "-n", namespace, "tiny", "--", "grep", "CapEff",
                                "/proc/1/status").stdout  # fmt: skip
    assert caps.split()[-1] == "0000000000000000"
    logs = node_cluster.kubectl("logs", "-n", namespace, "tiny").stdout
    assert "loaded checkpoint path=/var/cache/loom/models/tiny" in logs
    # The image holds what the runtime's CPU kernel build needs (g++, ninja).
    assert "CPU kernels are off" not in logs
