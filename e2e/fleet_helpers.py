"""Helpers of the operator suites: an operator process, a namespace with the CRDs, and reading
DeploymentCards and pods with the real kubectl.

Owns nothing but those helpers; every test module that runs the operator uses them.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import uuid
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from e2e.providers import REPO, Cluster
from loom_operator.k8s.kube import object_path
from loom_operator.testing.weights import Weights

# The weight-sync fleets (test_weight_sync, test_helm): the tiny model, 1 prefill + 2 decode.
MODEL = "tiny"
MAX_TOKENS = 16
ROLES = {"prefill": 1, "decode": 2}
PROMPTS = tuple(f"Sync prompt {i}: " + "a tale of two versions " * (1 + i % 3) for i in range(4))
SETTLE_S = 300.0


class Operator:
    """One `loom operator` process watching one namespace, its output in a log file."""

    def __init__(
        self, cluster: Cluster, namespace: str, tag: str, flags: tuple[str, ...] = ()
    ) -> None:
        assert cluster.root is not None
        self.log = cluster.root / f"operator-{namespace}-{tag}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "loom_operator.cli", "operator", "--kubeconfig",
                 str(cluster.kubeconfig), "--namespace", namespace, "--kv-connector", "tcp",
                 *flags],
                # --kubeconfig alone (no $KUBECONFIG), as a user runs it outside a cluster.
                stdout=out, stderr=subprocess.STDOUT,
                env={k: v for k, v in cluster.env.items() if k != "KUBECONFIG"},
            )  # fmt: skip

    def said(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def operator_namespace(cluster: Cluster) -> str:
    """A new namespace, with Loom's CRDs installed in the cluster."""
    if not cluster.runs_pods_as_processes:
        pytest.skip("needs pod IPs reachable from the test (the local provider)")
    name = f"op-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    for crd in ("deploymentcards.loom.dev", "modelcards.loom.dev", "rolescales.loom.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    cluster.kubectl("create", "namespace", name)
    return name


def card(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "deploymentcard", name, "-n", namespace, "-o", "json")
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def router_url(cluster: Cluster, namespace: str, name: str) -> str:
    selector = f"loom.dev/deployment={name},app.kubernetes.io/component=router"
    (router,) = [
        p for p in pods(cluster, namespace, selector) if not p["metadata"].get("deletionTimestamp")
    ]
    return f"http://{router['status']['podIP']}:8000/v1"


def ready(cluster: Cluster, namespace: str, name: str, decode: int = 0) -> dict[str, Any] | None:
    """The card once Ready for its current spec (and, given `decode`, once that many decode
    workers are ready). A Ready judged for an older generation does not count: right after a
    spec change the status still says what the operator saw before it."""
    got = card(cluster, namespace, name)
    generation = got["metadata"].get("generation")
    if condition(got, "Ready").get("status") != "True":
        return None
    if got["status"].get("observedGeneration") != generation:
        return None
    roles = got["status"].get("roles") or {}
    return got if not decode or roles.get("decode", {}).get("ready") == decode else None


def invalid(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    got = card(cluster, namespace, name)
    return got if condition(got, "Valid").get("status") == "False" else None


def patch_card(cluster: Cluster, namespace: str, name: str, patch: dict[str, Any]) -> None:
    args = ["patch", "deploymentcard", name, "-n", namespace, "--type=merge"]
    cluster.kubectl(*args, "-p", json.dumps(patch))


def settled(cluster: Cluster, namespace: str, name: str, version: str) -> dict[str, Any] | None:
    """The card once Ready with every worker on `version` and no weight sync in progress."""
    got = card(cluster, namespace, name)
    status = got.get("status") or {}
    if condition(got, "Ready").get("status") != "True":
        return None
    if condition(got, "WeightSyncing").get("status") != "False":
        return None
    return got if status.get("weightsVersion") == version else None


def admin_token(cluster: Cluster, namespace: str, name: str) -> str:
    """The card's admin token (its Secret `<name>-control`): what a trainer pushes with."""
    secret = cluster.kube.get(object_path("Secret", namespace, f"{name}-control"))
    return base64.b64decode(secret["data"]["admin-token"]).decode()


def pushed_tensors(weights: Weights, version: str) -> dict[str, torch.Tensor]:
    """The weights of `version`'s checkpoint as the fp64 fleet holds them (what a trainer
    pushes)."""
    path = weights.paths[weights.for_version(version)] / "model.safetensors"
    return {n: t.to(torch.float64) for n, t in load_file(str(path)).items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
