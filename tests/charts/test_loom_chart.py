"""The Helm chart with the real helm binary: lint, template, every manifest valid for Kubernetes
1.35, bad values refused by values.schema.json, and RBAC exactly the operator's declared rules."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from e2e.tools import ensure_tools

from loom_operator.k8s.rbac import LEASE_RULES, WATCHED_NAMESPACE_RULES
from loom_operator.k8s.render.security import (
    SCRATCH_ENV,
    SCRATCH_MOUNT,
    SCRATCH_VOLUME,
    container_security,
    pod_security,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "loom"
PD_VALUES = CHART / "ci" / "pd-values.yaml"
PROMETHEUS_OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor"}  # their CRDs are not Kubernetes'


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_tools() / "helm"


def run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def template(helm: Path, *args: str) -> list[dict[str, Any]]:
    out = run(helm, "template", "loom", str(CHART), "-n", "loom-system", "--include-crds", *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("values", [(), ("-f", str(PD_VALUES))], ids=["default", "pd"])
def test_helm_lint_passes(helm: Path, values: tuple[str, ...]) -> None:
    out = run(helm, "lint", "--strict", str(CHART), *values)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("values", [(), ("-f", str(PD_VALUES))], ids=["default", "pd"])
def test_every_rendered_manifest_validates_against_kubernetes_1_35(
    helm: Path, values: tuple[str, ...]
) -> None:
    manifests = template(helm, *values)
    kinds = {m["kind"] for m in manifests}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "Role"} <= kinds
    for m in manifests:
        if m["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert m["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(m, "1.35", strict=True)


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def test_rbac_is_exactly_the_rules_the_operator_declares(helm: Path) -> None:
    manifests = template(helm, "-f", str(PD_VALUES))
    roles = {
        (r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(manifests, "Role")
    }
    watched = [r.to_json() for r in WATCHED_NAMESPACE_RULES]
    assert roles[("serving", "loom-operator")]["rules"] == watched
    assert roles[("staging", "loom-operator")]["rules"] == watched
    assert roles[("loom-system", "loom-operator-lease")]["rules"] == [
        r.to_json() for r in LEASE_RULES
    ]
    assert not by_kind(manifests, "ClusterRole")  # namespaced where possible
    (deployment,) = by_kind(manifests, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=serving" in args and "--namespace=staging" in args
    assert "--network-policies" in args and "--metrics-namespace=monitoring" in args
    assert "--router-api-keys-secret=loom-api-keys:keys" in args and "--kv-connector=nixl" in args
    assert "--no-leader-elect" not in args and deployment["spec"]["replicas"] == 2


def test_all_namespaces_is_one_cluster_role(helm: Path) -> None:
    manifests = template(helm, "--set", "watch.allNamespaces=true")
    (role,) = by_kind(manifests, "ClusterRole")
    assert role["rules"] == [r.to_json() for r in WATCHED_NAMESPACE_RULES]
    (binding,) = by_kind(manifests, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "loom-operator", "namespace": "loom-system"}
    ]
    (deployment,) = by_kind(manifests, "Deployment")
    assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_chart_watches_its_own_namespace_by_default(helm: Path) -> None:
    manifests = template(helm)
    assert {r["metadata"]["namespace"] for r in by_kind(manifests, "Role")} == {"loom-system"}
    (deployment,) = by_kind(manifests, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["operator", "--namespace=loom-system"] and "--network-policies" in args
    assert not by_kind(manifests, "PodMonitor")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set", "operator.replicas=x"), "at '/operator/replicas': got string, want integer"),
        (("--set", "operator.replicas=2", "--set", "operator.leaderElection=false"),
         "at '/operator/leaderElection'"),
        (("--set", "operator.logLevel=LOUD"), "at '/operator/logLevel'"),
        (("--set", "operator.kvConnector=rdma"), "at '/operator/kvConnector'"),
        (("--set", "watch.namespaces={Bad_NS}"), "at '/watch/namespaces/0'"),
        (("--set", "monitoring.podMonitor.interval=often"), "at '/monitoring/podMonitor/interval'"),
        (("--set", "operator.resources.limits.memory=lots"),
         "at '/operator/resources/limits/memory'"),
        (("--set", "networkPolicy.enabled=true"),
         "additional properties 'networkPolicy' not allowed"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_with_the_path_of_the_value(
    helm: Path, values: tuple[str, ...], message: str
) -> None:
    out = run(helm, "template", "loom", str(CHART), *values)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


def test_the_operator_pod_is_locked_down_as_every_pod_loom_renders(helm: Path) -> None:
    (deployment,) = by_kind(template(helm), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"] == pod_security()
    assert container["securityContext"] == container_security()
    assert SCRATCH_VOLUME in pod["volumes"] and SCRATCH_MOUNT in container["volumeMounts"]
    assert SCRATCH_ENV in container["env"]


def test_the_operator_serves_its_planner_metrics_on_its_pod_ip(helm: Path) -> None:
    (deployment,) = by_kind(template(helm), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--metrics-port=9464" in container["args"]
    assert "--metrics-address=$(POD_IP)" in container["args"]
    assert {"name": "metrics", "containerPort": 9464} in container["ports"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    (off,) = by_kind(template(helm, "--set", "operator.metricsPort=0"), "Deployment")
    args = off["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--metrics-")]


def test_the_push_api_is_off_until_a_port_is_given_then_served_behind_a_service(
    helm: Path,
) -> None:
    assert not by_kind(template(helm), "Service")
    docs = template(helm, "--set", "operator.pushPort=8093")
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--push-port=8093" in container["args"]
    assert "--push-address=$(POD_IP)" in container["args"]
    assert {"name": "push", "containerPort": 8093} in container["ports"]
    (service,) = by_kind(docs, "Service")
    assert service["spec"]["ports"] == [{"name": "push", "port": 8093, "targetPort": "push"}]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_push_api_with_replicas_waiting_for_a_leader_is_refused(helm: Path) -> None:
    result = run(helm, "template", "loom", str(CHART), "--set", "operator.pushPort=8093",
                 "--set", "operator.replicas=2")  # fmt: skip
    assert result.returncode != 0 and "needs operator.shards > 0" in result.stderr
    sharded = template(helm, "--set", "operator.pushPort=8093", "--set", "operator.replicas=3",
                       "--set", "operator.shards=12")  # fmt: skip
    assert by_kind(sharded, "Service")
