"""`helm install loom charts/loom` on the real control plane: the operator runs as a pod under the
chart's ServiceAccount (its projected token: a missing RBAC verb fails here), serves a card, and
syncs its weights; `helm uninstall` removes everything the chart made.

The stand-in kubelet runs the operator pod's `loom operator …` command with the project's
environment instead of the image (docs/e2e.md); NetworkPolicies are rendered (and accepted by
the API server) but not enforced: the harness has no network plugin.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from e2e.conftest import wait_for
from e2e.fleet_helpers import MAX_TOKENS, MODEL, PROMPTS, ROLES, SETTLE_S, router_url, settled
from e2e.providers import REPO, Cluster
from loom_operator.testing.cards import card_text
from loom_operator.testing.load import StreamingLoad, check_streams
from loom_operator.testing.weights import Weights

pytestmark = pytest.mark.timeout(600)

NAME = "helm-sync"
CHART = REPO / "charts" / "loom"


def objects(cluster: Cluster, namespace: str, kinds: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", kinds, "-n", namespace, "-l", "app.kubernetes.io/part-of=loom",
                          "-o", "json")  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def apply(cluster: Cluster, namespace: str, weights: Weights, root: Path, version: str) -> None:
    path = root / f"{NAME}-{version}.yaml"
    path.write_text(card_text(weights.source(version), version=version, roles=ROLES, name=NAME,
                              model=MODEL, drain=30, min_uncached=0))  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", str(path))


def test_helm_install_serves_and_syncs_under_the_charts_rbac_and_uninstalls_cleanly(
    cluster: Cluster, weights: Weights, tmp_path: Path
) -> None:
    if not cluster.runs_pods_as_processes:
        pytest.skip("needs pod IPs reachable from the test (the local provider)")
    ns = f"helm-{uuid.uuid4().hex[:6]}"
    release = "loom"
    try:
        cluster.helm("install", release, str(CHART), "-n", ns, "--create-namespace",
             "--set", "operator.kvConnector=tcp", "--wait=false")  # fmt: skip
        kinds = "serviceaccounts,roles,rolebindings,deployments,configmaps"
        made = {(o["kind"], o["metadata"]["name"]) for o in objects(cluster, ns, kinds)}
        assert {("ServiceAccount", "loom-operator"), ("Role", "loom-operator"),
                ("Role", "loom-operator-lease"),
                ("Deployment", "loom-operator")} <= made  # fmt: skip

        def running() -> list[dict[str, Any]]:
            pods = objects(cluster, ns, "pods")
            return [p for p in pods if p["status"].get("phase") == "Running"]

        (pod,) = wait_for(running, 120, "the operator pod to run")
        assert pod["spec"]["serviceAccountName"] == "loom-operator"
        wait_for(
            lambda: cluster.kubectl("get", "lease", "loom-operator", "-n", ns, check=False)
            .returncode == 0,
            120, "the operator pod to take the lease (its own account's token)",
        )  # fmt: skip

        apply(cluster, ns, weights, tmp_path, "v1")
        wait_for(lambda: settled(cluster, ns, NAME, "v1"), SETTLE_S, "the card Ready on v1")
        url = router_url(cluster, ns, NAME)
        chat = OpenAI(base_url=url, api_key="unused", timeout=60).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert chat.usage is not None and chat.usage.completion_tokens == 4
        policies = cluster.kubectl("get", "networkpolicies", "-n", ns, "-o", "name").stdout.split()
        assert sorted(policies) == [f"networkpolicy.networking.k8s.io/{NAME}-router",
                                    f"networkpolicy.networking.k8s.io/{NAME}-workers"]  # fmt: skip

        with StreamingLoad(url, MODEL, PROMPTS, MAX_TOKENS, clients=2) as load:
            load.wait_completed(4, 120)
            apply(cluster, ns, weights, tmp_path, "v2")
            wait_for(lambda: settled(cluster, ns, NAME, "v2"), SETTLE_S, "a Rolling sync to v2")
            load.wait_completed(4, 120)
        problems = check_streams(load.stop(), weights.expected("v1", "v2"))
        assert not problems, "\n".join(problems[:10])

        cluster.kubectl("delete", "deploymentcard", NAME, "-n", ns, "--wait=true", "--timeout=120s")
        cluster.helm("uninstall", release, "-n", ns, "--wait", "--timeout", "120s")
        wait_for(lambda: not objects(cluster, ns, kinds + ",pods"), 120,
                 "every object the chart made to be gone")  # fmt: skip
        # CRDs stay (Helm never deletes what it installed from crds/): cards elsewhere keep theirs.
        crd = cluster.kubectl("get", "crd", "deploymentcards.loom.dev", check=False)
        assert crd.returncode == 0
    finally:
        cluster.helm("uninstall", release, "-n", ns, check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
